"""The one compiled module: the heuristic filters' text scan (``src/tokenmix/curate/heuristics/_text_scan.c``). It is
optional: where no C compiler (or no Python headers) is found, the install goes on without it and the filters count
in plain Python (``tokenmix.curate.heuristics.plain_scan``)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tokenmix.curate.heuristics._text_scan", ["src/tokenmix/curate/heuristics/_text_scan.c"], optional=True)])
