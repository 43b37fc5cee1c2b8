"""The extension API on the NumPy MLP: a table, a metric, a hook and a plugin (docs/extending.md).

Run it:  PYTHONPATH=bootstrap:examples PPROBE_PLUGINS=ext_plugin python examples/ext_demo.py
then:    pprobe query "SELECT * FROM python.training_state"
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_mlp  # noqa: E402

import pprobe  # noqa: E402
from pprobe import config, hook_function, metric, table  # noqa: E402

every = config.register("demo.loss_every", default=1, type=int, help="log the loss every N steps")
state = {"loss": None, "steps": 0}


@hook_function("numpy_mlp.report")  # each call: the step and the loss the MLP reports
def on_report(i, loss):
    state["loss"], state["steps"] = loss, i + 1
    if i % every == 0:
        pprobe.record("losses", {"i": i, "loss": loss})


@table("training_state")
def training_state():
    return {"steps_done": state["steps"], "loss": state["loss"]}


@metric("loss")
def loss_metric():
    return state["loss"]


if __name__ == "__main__":
    numpy_mlp.main(steps=30)
    print(pprobe.sql("SELECT count(*) AS rows FROM python.losses").to_pylist())
