"""Which files under a directory are records: NeMo Curator's ``get_all_files_paths_under``, less what a curation run
keeps beside the shards it writes.

A curated directory holds, besides its shards, the run's statistics (``curation_stats.json``), its work directory
(``.curate/``) and, while a task writes or after a run was killed, hidden temporary files (``.<shard>.partial``,
``curation_stats.json.partial``). None of them is a shard, so a step that lists the directory the step before it wrote
(NeMo's scripts chain this way: ``get_all_files_paths_under(dir)`` then ``read_json(files)``) must not list them.
"""

from __future__ import annotations

import logging
import os
import posixpath

from tokenmix._object_stores import url_to_fs

logger = logging.getLogger(__name__)

WORK_DIR = ".curate"
"""A pipeline's work directory, under its output directory."""
STATS_FILE = "curation_stats.json"
"""A pipeline's statistics, in its output directory (and in its work directory)."""


def is_curation_bookkeeping(relative_path: str) -> bool:
    """Whether a file, by its path below a directory, is what a curation run keeps there rather than a shard: the work
    directory's files, the statistics, a temporary file."""
    parts = relative_path.replace(os.sep, "/").split("/")
    name = parts[-1]
    return (WORK_DIR in parts[:-1] or name in (STATS_FILE, STATS_FILE + ".partial")
            or (name.startswith(".") and name.endswith(".partial")))


def get_all_files_paths_under(root: str, recurse_subdirectories: bool = True, followlinks: bool = False,
                              keep_extensions: str | list[str] | None = None) -> list[str]:
    """Every file under ``root`` (its subdirectories too, unless ``recurse_subdirectories`` is false), sorted, as
    ``root`` joined with the file's path below it (NeMo Curator's function of this name); ``keep_extensions``
    (``"jsonl"`` or a list) keeps only the files ending so. A curation run's own files (``curation_stats.json``, the
    ``.curate`` work directory, temporary ``.partial`` files) are left out: they are no shards.

    ``root`` may be an fsspec URL (``s3://bucket/dir``); ``followlinks`` follows symbolic links to directories on a
    local filesystem."""
    if "://" in root:
        fs, path = url_to_fs(root)
        found = fs.find(path, maxdepth=None if recurse_subdirectories else 1)
        files = [(fs.unstrip_protocol(p), posixpath.relpath(p, path)) for p in found]
    elif recurse_subdirectories:
        files = [(os.path.join(directory, name), os.path.relpath(os.path.join(directory, name), root))
                 for directory, _, names in os.walk(root, followlinks=followlinks) for name in names]
    else:
        files = [(entry.path, entry.name) for entry in os.scandir(root) if entry.is_file()]
    paths = sorted(path for path, relative in files if not is_curation_bookkeeping(relative))
    if keep_extensions is None:
        return paths
    wanted = tuple(e if e.startswith(".") else "." + e for e in ([keep_extensions] if isinstance(keep_extensions, str) else keep_extensions))
    kept = [p for p in paths if p.endswith(wanted)]
    if len(kept) < len(paths):
        logger.warning("%s: %d of %d files left out: their names do not end in %s", root, len(paths) - len(kept), len(paths), " or ".join(wanted))
    return kept
