"""Placing one process's host arrays on its devices, with the per-call work of ``jax.device_put`` done once.

Putting a host array on a ``NamedSharding`` with ``jax.device_put`` costs about 50 us an array on 8 CPU devices, and
four fifths of it is Python dispatch (abstract values, sharding checks, per-device slicing); the transfer itself,
JAX's ``batched_device_put``, is the rest (and zero-copy for aligned arrays on CPU). A loader places arrays of the
same shapes, dtypes and shardings every step, so that dispatch gives the same answer each time. ``ArrayPlacer`` asks
``jax.device_put`` once per set of shapes and dtypes, keeps the result's abstract value, sharding and device order as
the template, and afterwards hands each device's slice straight to ``batched_device_put``. That function is JAX's
internal one: when it is missing, or its result for the first batch differs from ``jax.device_put``'s in anything
(abstract value, sharding, commitment, which device holds which index, values), the placer keeps using
``jax.device_put``, so the fast path can only be as right as the public one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

logger = logging.getLogger(__name__)


def _internal_put() -> Callable[..., jax.Array] | None:
    """JAX's per-device transfer ``batched_device_put(aval, sharding, per_device_arrays, devices)``, if this JAX has it."""
    try:
        from jax._src.interpreters.pxla import batched_device_put
    except ImportError:
        return None
    return batched_device_put


@dataclass(frozen=True)
class _Template:
    """How one array lands on the devices: what ``jax.device_put`` made of it the first time."""

    aval: Any
    sharding: Sharding
    devices: list[Any]
    indices: list[tuple[slice, ...]]


class ArrayPlacer:
    """Puts lists of host arrays on fixed shardings (all devices addressable by this process), one transfer per device shard.

    Equivalent to ``jax.device_put(arrays, shardings)``; faster from the second call with the same shapes and dtypes.
    Safe to call from several threads.
    """

    def __init__(self, shardings: Sequence[Sharding]):
        self.shardings = list(shardings)
        self._put = _internal_put()
        self._templates: dict[tuple[tuple[tuple[int, ...], np.dtype], ...], list[_Template] | None] = {}
        self._lock = threading.Lock()

    @property
    def direct(self) -> bool:
        """True when later calls bypass ``jax.device_put``: the direct path reproduced its result for some set of shapes."""
        return any(t is not None for t in self._templates.values())

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[jax.Array]:
        """The arrays on the devices, each as ``jax.device_put(array, sharding)`` would place it."""
        key = tuple((a.shape, a.dtype) for a in arrays)
        if key not in self._templates:
            with self._lock:
                if key not in self._templates:
                    return self._first(key, arrays)
        templates = self._templates[key]
        if templates is None:
            return jax.device_put(list(arrays), self.shardings)
        put = self._put
        return [put(t.aval, t.sharding, [a[i] for i in t.indices], t.devices) for t, a in zip(templates, arrays)]

    def _first(self, key: tuple[tuple[tuple[int, ...], np.dtype], ...], arrays: Sequence[np.ndarray]) -> list[jax.Array]:
        """Place through ``jax.device_put`` and keep its result as the template when the direct path reproduces it."""
        placed = jax.device_put(list(arrays), self.shardings)
        templates = None
        if self._put is not None:
            try:
                templates = [self._template(host, ref) for host, ref in zip(arrays, placed)]
            except Exception as e:  # noqa: BLE001 - any disagreement means: keep the public path
                logger.debug("placing %s through jax.device_put: the direct path does not match it (%s)", key, e)
        if templates is not None and any(t is None for t in templates):
            templates = None
        self._templates[key] = templates
        return placed

    def _template(self, host: np.ndarray, ref: jax.Array) -> _Template | None:
        """The template of ``host`` if placing it directly gives exactly ``ref`` (``jax.device_put``'s result), else None."""
        by_device = ref.sharding.addressable_devices_indices_map(host.shape)
        template = _Template(ref.aval, ref.sharding, list(by_device), list(by_device.values()))
        direct = self._put(template.aval, template.sharding, [host[i] for i in template.indices], template.devices)
        same = (direct.aval == ref.aval and direct.sharding == ref.sharding and direct.committed == ref.committed
                and [(s.device, s.index) for s in direct.addressable_shards] == [(s.device, s.index) for s in ref.addressable_shards]
                and all(np.array_equal(np.asarray(s.data), np.asarray(r.data))
                        for s, r in zip(direct.addressable_shards, ref.addressable_shards)))
        return template if same else None
