"""The one compiled module: the heuristic filters' text scan (``src/tokenmix/curate/_text_scan.c``)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tokenmix.curate._text_scan", ["src/tokenmix/curate/_text_scan.c"])])
