"""Makes ``eval_batches.json``: the batches Levanter's own ``DataLoader(pad_final_batch=True)`` (its default, what its
evaluator reads through) gives over sets of N examples, N not always a multiple of the batch size, on a mesh whose data
axis has 2 devices. Example ``i`` holds tokens ``i + 1``, so a batch's rows name their examples; Levanter pads with
all-zero examples, which read here as example -1. Run in the side venv, never by the tests (Levanter is no tokenmix
dependency):

    XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \\
        /work/sidevenv/levanter/bin/python tests/data/levanter/make_eval_batches.py > tests/data/levanter/eval_batches.json
"""

import json
import sys
from importlib.metadata import version

import jax
import numpy as np
from jax.sharding import Mesh
from levanter.data import DataLoader, ListAsyncDataset

mesh = Mesh(np.array(jax.devices()).reshape(2, 1), ("data", "model"))
out = {"levanter": version("levanter"), "jax": jax.__version__, "data_axis": 2, "cases": []}
for n, batch_size, max_batches in ((11, 4, None), (3, 4, None), (1, 4, None), (8, 4, None), (13, 8, None), (11, 4, 2)):
    data = ListAsyncDataset([{"tokens": np.full(5, i + 1, np.int32), "loss_weight": np.ones(5, np.float32)} for i in range(n)],
                            is_complete=True)
    if max_batches is not None:  # as levanter.main.train_lm does: max_eval_batches * eval_batch_size examples of each set
        data = data.take(max_batches * batch_size)
    batches = []
    for batch in DataLoader(data, batch_size, mesh=mesh, axis_resources={"batch": "data"}, pad_final_batch=True):
        tokens, weight = np.asarray(batch["tokens"]), np.asarray(batch["loss_weight"])
        batches.append({"examples": [int(t[0]) - 1 for t in tokens], "padding": [bool((t == 0).all()) for t in tokens],
                        "loss_weight": [float(w.sum()) for w in weight]})
    out["cases"].append({"examples": n, "batch_size": batch_size, "max_eval_batches": max_batches, "batches": batches})
json.dump(out, sys.stdout)
