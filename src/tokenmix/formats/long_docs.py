"""Splitting very long documents before tokenizing, only where the result is provably unchanged.

A tokenizer handles one long string as a single unit of work (one thread, offsets for the whole
string, and for some models super-linear time); splitting it into pieces and concatenating the
pieces' token ids gives the same ids when every cut falls on a pre-tokenization boundary. For
byte-level BPE with the GPT-2 split regex (no normalizer, no prefix space), a single ASCII space
between two ASCII letters or digits is always such a boundary: no regex alternative can consume a
word character followed by a space, and matching restarts at the space. For other tokenizers no
split is made (``tokenizer_facts.TokenizerFacts.exact_split`` says which tokenizers are of the first kind).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

logger = logging.getLogger(__name__)

_CUT = re.compile(r"(?<=[A-Za-z0-9]) (?=[A-Za-z0-9])")


def split_text(text: str, max_chars: int) -> Iterator[str]:
    """Cut ``text`` into pieces of about ``max_chars`` at spaces between ASCII word characters.

    The pieces come one at a time, so that a very long text is not held twice. A piece grows past ``max_chars`` only when
    no cut point exists in its window.
    """
    start = 0
    while len(text) - start > max_chars:
        cut = _last_cut(text, start + max_chars // 2, start + max_chars)
        if cut is None:
            match = _CUT.search(text, start + max_chars)
            if match is None:
                break
            cut = match.start()
        yield text[start:cut]
        start = cut
    yield text[start:]


def _last_cut(text: str, lo: int, hi: int) -> int | None:
    """The last cut point (a space between ASCII word characters) in ``[lo, hi)``: looked for in the last kilobyte
    first, then in windows four times wider, so that finding it costs about a kilobyte's scan, not half a window's."""
    width = 1024
    start = hi
    while start > lo:
        start = max(lo, hi - width)
        last = None
        for match in _CUT.finditer(text, start, hi):
            last = match.start()
        if last is not None:
            return last
        width *= 4
    return None
