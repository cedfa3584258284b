"""``export_cache``: one call for every export target, what ``tokenmix export`` runs."""

from __future__ import annotations

from typing import Any

from tokenmix.export.streaming import TokenSource

EXPORT_KINDS = ("megatron", "datatrove", "nanoset", "levanter", "hdf5")


def export_cache(cache: TokenSource, to: str, output: str, tokenizer: str | None = None, hdf5: Any = None, progress: bool = True) -> dict[str, Any]:
    """Write a finished cache (``TokenCache``, or the ``TokenFilesCache`` of a token-file source) as ``to``:

    - ``megatron``: ``output`` is the prefix of ``output.bin`` and ``output.idx``;
    - ``datatrove``: ``output`` is the ``.ds`` file (with ``.index``, ``.metadata`` and, for masked formats, ``.loss``);
    - ``nanoset``: ``output`` is the ``*_input_ids.npy`` token dump;
    - ``levanter``: ``output`` is a Levanter cache directory (``<cache_dir>/<split>``; a path or URL);
    - ``hdf5``: ``output`` is a directory of Cerebras ``.h5`` files and ``data_params.json`` (options: ``hdf5``, an
      ``Hdf5ExportOptions``).

    ``tokenizer`` is the name recorded where the target keeps one (datatrove metadata, Levanter's ledger; Levanter's
    export needs it, and loads it), and for ``hdf5`` the tokenizer that decodes the samples (default: the one the
    cache's ledger records). Returns what
    was written (documents, tokens, dtype; HDF5: its statistics).
    """
    if not cache.is_finished():
        raise ValueError(f"{cache.location}: the cache's build has not finished: it is still running, or it was interrupted (run "
                         "build-cache again to finish it); export it once its build has finished")
    if to == "megatron":
        from tokenmix.export.megatron import export_megatron

        return export_megatron(cache, output, progress)
    if to == "datatrove":
        from tokenmix.export.datatrove_tokens import export_datatrove

        return export_datatrove(cache, output, tokenizer, progress)
    if to == "nanoset":
        from tokenmix.export.nanoset import export_nanoset

        return export_nanoset(cache, output, progress)
    if to == "levanter":
        from tokenmix.export.levanter import export_levanter

        if not tokenizer:
            raise ValueError("export --to levanter needs the tokenizer Levanter will open the cache with (--tokenizer NAME, or "
                             "--config_path CFG.yaml whose tokenizer is used)")
        return export_levanter(cache, output, tokenizer, progress)
    if to == "hdf5":
        from tokenmix.export.hdf5 import export_hdf5
        from tokenmix.export.hdf5_options import Hdf5ExportOptions

        return export_hdf5(cache, output, hdf5 or Hdf5ExportOptions(), progress, tokenizer)
    raise ValueError(f"export: {to!r} is not a target; choose one of {list(EXPORT_KINDS)}")
