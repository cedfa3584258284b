"""Importing this module registers every heuristic filter family as choices of ``DocumentFilter``, so that a config
names them (``filter: {type: word_count}``)."""

from tokenmix.curate.heuristics import boilerplate, characters, lines, repetition, substrings, urls, words  # noqa: F401
