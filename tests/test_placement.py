"""ArrayPlacer: the loader's placement of host arrays, against ``jax.device_put`` on a mesh of 8 CPU devices."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from tokenmix.loader import placement
from tokenmix.loader.placement import ArrayPlacer

SPECS = [PartitionSpec("data", None), PartitionSpec("data"), PartitionSpec(None, "model"), PartitionSpec(("data", "model"), None),
         PartitionSpec()]


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((4, 2), ("data", "model"))


def arrays_for(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2**31 - 1, (16, 8), dtype=np.int32), rng.integers(0, 100, 16, dtype=np.int32),
            rng.random((16, 8)) < 0.5, rng.integers(-5, 5, (16, 8), dtype=np.int64), rng.random((16, 8))]


def assert_same_placement(got: jax.Array, want: jax.Array) -> None:
    assert got.aval == want.aval and got.sharding == want.sharding and got.committed == want.committed
    assert [(s.device, s.index) for s in got.addressable_shards] == [(s.device, s.index) for s in want.addressable_shards]
    for s, w in zip(got.addressable_shards, want.addressable_shards, strict=True):
        assert np.array_equal(np.asarray(s.data), np.asarray(w.data))


def test_every_call_places_as_jax_device_put_does(mesh):
    """Batch, column, 2-D and replicated shardings; int32, bool, and int64 / float64 (which JAX narrows to 32 bits):
    the first call and every later one (the direct path, with new values) equal ``jax.device_put``'s arrays."""
    shardings = [NamedSharding(mesh, spec) for spec in SPECS]
    placer = ArrayPlacer(shardings)
    for seed in range(3):
        host = arrays_for(seed)
        got = placer(host)
        for g, w in zip(got, jax.device_put(host, shardings), strict=True):
            assert_same_placement(g, w)
        assert placer.direct  # checked on the first call; every later call is direct
    jax.jit(lambda *xs: [x + 1 for x in xs])(*got)  # the arrays are ordinary inputs to a jitted function


def test_new_shapes_are_checked_again(mesh):
    """A new batch size is placed through ``jax.device_put`` first, then directly; older shapes keep their template."""
    placer = ArrayPlacer([NamedSharding(mesh, PartitionSpec("data", None))])
    for rows in (8, 16, 8, 16, 32, 32):
        host = [np.arange(rows * 4, dtype=np.int32).reshape(rows, 4)]
        assert_same_placement(placer(host)[0], jax.device_put(host[0], placer.shardings[0]))


def test_a_jax_without_the_internal_transfer_uses_device_put(mesh, monkeypatch):
    monkeypatch.setattr(placement, "_internal_put", lambda: None)
    placer = ArrayPlacer([NamedSharding(mesh, PartitionSpec("data", None))])
    for seed in range(2):
        host = arrays_for(seed)[:1]
        assert_same_placement(placer(host)[0], jax.device_put(host[0], placer.shardings[0]))
    assert not placer.direct


def test_a_direct_path_that_disagrees_is_not_used(mesh):
    """If the internal transfer put shards on other devices than ``jax.device_put`` does (a JAX whose internals
    changed), the placer notices on the first call and keeps the public path."""
    placer = ArrayPlacer([NamedSharding(mesh, PartitionSpec("data", None))])
    put = placer._put
    placer._put = lambda aval, sharding, xs, devices: put(aval, sharding, xs[::-1], devices)
    for seed in range(2):
        host = arrays_for(seed)[:1]
        assert_same_placement(placer(host)[0], jax.device_put(host[0], placer.shardings[0]))
    assert not placer.direct
