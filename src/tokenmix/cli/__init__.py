"""The ``tokenmix`` command line: a thin layer over the library."""
