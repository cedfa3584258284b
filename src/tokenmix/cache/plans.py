"""Packing plans kept next to a cache, under ``<cache>/packing/<plan id>/``.

A plan (made by ``datasets.packed.PackedDataset``) is ``plan.json`` (its options, progress and
statistics) and a jagged array whose row e lists the cache rows of example e's pieces. It grows with
the cache and is reused by every run with the same options; a plan made with other options is refused.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from tokenmix.cache.ledger import CacheMismatchError
from tokenmix.cache.store import JaggedArray, JsonDocuments
from tokenmix.sources.urls import join_location

logger = logging.getLogger(__name__)

PLAN_VERSION = 1
PLAN_FILE = "plan.json"
PLAN_ARRAY = "examples"
PLANS_DIR = "packing"


def plan_location(cache_location: str, plan_id: str) -> str:
    """Where the plan ``plan_id`` of a cache is kept."""
    return join_location(cache_location, PLANS_DIR, plan_id)


class PlanStore:
    """A packing plan on storage: ``plan.json`` and the jagged array of each example's piece rows."""

    def __init__(self, location: str, options: dict[str, Any]):
        self.location = location
        self.options = options
        self._docs = JsonDocuments(location)
        self._arrays: dict[bool, JaggedArray] = {}
        """The plan's array as read, and as written (which stores every chunk): by ``create``."""

    def read(self) -> dict[str, Any] | None:
        """The stored plan's progress, or None when there is none; a plan made with other options is an error."""
        plan = self._docs.read(PLAN_FILE)
        if plan is None:
            return None
        if plan.get("options") != self.options or plan.get("version") != PLAN_VERSION:
            raise CacheMismatchError(
                f"packing plan at {self.location} was made with {plan.get('options')} (version {plan.get('version')}), "
                f"not {self.options} (version {PLAN_VERSION}); delete {self.location} to plan again"
            )
        return plan

    def read_arrays(self, examples: int, pieces: int) -> tuple[np.ndarray, np.ndarray]:
        """Piece boundaries of the first ``examples`` examples, and the cache row of each of their ``pieces`` pieces."""
        array = self._open()
        bounds = array.row_bounds(0, examples)
        rows = array.read_tokens(0, pieces) if pieces else np.empty(0, np.int64)
        return np.asarray(bounds, np.int64), np.asarray(rows, np.int64)

    def write(self, first_example: int, first_piece: int, rows: np.ndarray, counts: np.ndarray, plan: dict[str, Any]) -> bool:
        """Append examples ``first_example...`` (``counts`` pieces each, cache ``rows`` per piece), then record the plan.

        Returns False (and logs why) when the plan cannot be stored: the dataset then plans in memory.
        """
        try:
            array = self._open(create=True)
            for write in array.write_rows(first_example, first_piece, rows, counts):
                write.result()
            self._docs.write(PLAN_FILE, {"version": PLAN_VERSION, "options": self.options, **plan})
            array.publish(plan["examples"])
        except (OSError, ValueError) as e:
            logger.warning("%s: cannot store the packing plan (%s); it is kept in memory only", self.location, e)
            return False
        return True

    def _open(self, create: bool = False) -> JaggedArray:
        if create not in self._arrays:
            self._arrays[create] = JaggedArray.open(self.location, PLAN_ARRAY, "int64", create=create)
        return self._arrays[create]


def stored_plans(cache_location: str) -> dict[str, dict[str, Any]]:
    """The packing plans kept next to a cache, by plan id: each plan's options, progress and statistics."""
    docs = JsonDocuments(join_location(cache_location, PLANS_DIR))
    plans = {}
    for key in docs.keys():
        parts = key.split("/")
        if len(parts) == 2 and parts[1] == PLAN_FILE:
            plan = docs.read(key)
            if plan is not None:
                plans[parts[0]] = plan
    return plans
