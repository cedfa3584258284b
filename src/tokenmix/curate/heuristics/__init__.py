"""NeMo Curator's heuristic document filters (Gopher, Rae et al. 2021, and C4), scoring a whole batch of texts at once.

The scores follow ``nemo_curator/filters/heuristic_filter.py``, a family to a module: ``words``, ``characters``,
``lines``, ``repetition``, ``urls``, ``boilerplate``, ``substrings``. What a character, a word and a line ending are
to them is in ``character_classes``. The word, character and line filters are ratios of per-text counts that one
scan of the batch's UTF-8 bytes makes for all of them, and the repetition filters of counts that one more pass makes
for lines and one for paragraphs (``scan``: compiled, ``_text_scan.c``, or where it was not built in plain Python,
``plain_scan``); ``analyses`` makes those counts once per batch and shares them between filters. Boilerplate
paragraphs use Arrow's string kernels, and the n-gram scores loop over the documents in Python.

Importing ``registry`` registers every one of them as a choice of ``DocumentFilter`` (``filter: {type: word_count}``);
the pipeline's stages do.
"""
