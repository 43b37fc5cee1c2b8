"""NumPy's builtins and Python-level functions (FunctionProxy) are recorded from the proxy
class's tp_call, in the native core: no Python frame of pprobe's runs for such a call."""

from __future__ import annotations

import json
import os

import pytest
from helpers import ops, run_script

PROXY_SCRIPT = """
import json, sys
import numpy as np

x = np.ones(3)


def calls():
    np.asarray(x)                  # NumPy builtins: recorded through FunctionProxy
    np.array(x, copy=True)
    np.zeros(3)
    np.asarray_chkfinite(x)        # a Python-level NumPy function


frames = []


def profile(frame, event, arg):
    if event == "call":
        frames.append(frame.f_code.co_filename + ":" + frame.f_code.co_name)


for i in range(4):
    if i == 1:  # the call sites and stacks are named at the first calls (pprobe's Python)
        sys.setprofile(profile)
    calls()
sys.setprofile(None)
print(json.dumps(frames))
"""


@pytest.mark.skipif(
    os.environ.get("PPROBE_CORE") == "python",
    reason="the Python engine's proxies call pprobe.recorder.call from their __call__",
)
def test_a_proxied_numpy_function_runs_no_python_frame_of_pprobe(tmp_path):
    """FunctionProxy's calls go from its class's tp_call to the native core: no Python frame
    of the proxy's __call__ (it showed in profilers, and cost ~0.5 us a call)."""
    r = run_script(tmp_path, PROXY_SCRIPT, env={"PPROBE_MODE": "log"}).check()
    frames = json.loads(r.out.strip().splitlines()[-1])
    mine = [f for f in frames if "/pprobe/" in f.replace(os.sep, "/")]
    assert not mine, frames
    rows = [x["op"] for x in ops(r.run_dir)]
    for op in ("numpy.asarray", "numpy.array", "numpy.zeros", "numpy.asarray_chkfinite"):
        assert rows.count(op) == 4, (op, rows)  # every call is still a row


TRACEBACK = """
import traceback
import numpy as np

for call in (lambda: np.zeros(-1), lambda: np.array([1, [2, 3]], dtype=float)):
    try:
        call()
    except ValueError:
        print("|".join(f.filename for f in traceback.extract_tb(__import__("sys").exc_info()[2])))
"""


@pytest.mark.skipif(
    os.environ.get("PPROBE_CORE") == "python",
    reason="the Python engine's proxies add a frame of numpy_namespace.py (README, Limits)",
)
def test_a_traceback_through_a_builtins_proxy_is_the_unprobed_one(tmp_path):
    plain = run_script(tmp_path, TRACEBACK, probe=False).check()
    probed = run_script(tmp_path, TRACEBACK, env={"PPROBE_MODE": "log"}).check()
    assert probed.out == plain.out
    assert "pprobe" not in probed.out
    assert len(probed.out.strip().splitlines()) == 2
