"""PPROBE_ON_NAN: warn or raise at the first op that makes NaN/inf from finite inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ops, run_script, sql

PROG = """
    import warnings
    import numpy as np
    warnings.simplefilter("ignore", RuntimeWarning)   # NumPy's own divide-by-zero warnings
    warnings.filterwarnings("always", message="pprobe")
    def loss(p):
        return np.log(p)                       # log(0) = -inf: born here
    mask = np.full(2, -np.inf)                 # -inf on purpose: not an origin
    p = np.array([0.5, 0.25])
    for step in range(2):
        l = loss(p)
    p[1] = 0.0
    with warnings.catch_warnings(record=True) as got:
        warnings.filterwarnings("always", message="pprobe")
        try:
            for step in range(2):
                l = loss(p)
                z = l * 0.0                    # -inf * 0 = NaN: carried on, not born here
                np.sqrt(-np.ones(1))           # another origin: reported once only
        except FloatingPointError as e:
            print("raised:", e)
    for w in got:
        print("warned:", w.filename.endswith("prog.py"), w.lineno, w.category.__name__, w.message)
"""


@pytest.mark.parametrize("how", ["warn", "raise"])
def test_the_first_origin_warns_or_raises_at_the_programs_line(tmp_path: Path, how: str) -> None:
    r = run_script(tmp_path, PROG, env={"PPROBE_MODE": "stats", "PPROBE_ON_NAN": how}).check()
    lines = r.out.splitlines()
    what = (
        "pprobe: first NaN/inf from finite inputs: numpy.log (output 0: 0 NaN, 1 inf) at step 0,"
        f" module -, called from {tmp_path / 'prog.py'}:7 in loss (PPROBE_ON_NAN={how})"
    )
    if how == "raise":
        assert lines == [f"raised: {what}"]
    else:
        assert lines == [f"warned: True 7 RuntimeWarning {what}"]
    # the rows before it are on disk, the origin's row too, with its statistics
    logs = ops(r.run_dir, "op = 'numpy.log'")
    assert len(logs) == (3 if how == "raise" else 4)
    bad = sql(
        r.run_dir,
        "SELECT t.inf_count FROM ops o JOIN tensors t USING (pid, seq) "
        f"WHERE o.seq = {logs[2]['seq']} AND t.role = 'output'",
    )
    assert bad == [{"inf_count": 1}]
    # raise: the call raised instead of returning, so the loop stopped there
    muls = ops(r.run_dir, "op = 'numpy.ndarray.__mul__'")
    assert len(muls) == (0 if how == "raise" else 2)


def test_off_by_default_and_log_mode_has_no_statistics(tmp_path: Path) -> None:
    for env in ({"PPROBE_MODE": "stats"}, {"PPROBE_MODE": "log", "PPROBE_ON_NAN": "raise"}):
        r = run_script(tmp_path, PROG, env=env).check()
        assert r.out == "" and "pprobe" not in r.err


def test_torch_raise_names_the_op_and_masked_fill_is_on_purpose(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    r = run_script(
        tmp_path,
        """
        import torch
        x = torch.tensor([1.0, 0.0])
        m = torch.zeros(2).masked_fill(torch.tensor([True, False]), float("-inf"))
        s = torch.softmax(m, 0)                # finite again
        try:
            torch.log(x)
        except FloatingPointError as e:
            print(e)
        """,
        env={"PPROBE_MODE": "stats", "PPROBE_ON_NAN": "raise"},
    ).check()
    assert r.out.startswith("pprobe: first NaN/inf from finite inputs: torch.log (output 0: ")
    assert f"called from {tmp_path / 'prog.py'}:7 in <module>" in r.out


def test_a_bad_value_names_the_variable_and_its_choices(tmp_path: Path) -> None:
    r = run_script(tmp_path, "print(1)", env={"PPROBE_ON_NAN": "explode"}).check()
    assert r.out == "1\n"
    assert "PPROBE_ON_NAN='explode' is not valid; allowed: off, warn, raise" in r.err


def test_pprobe_nans_allowlist_expects_infs_but_never_excuses_a_nan(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import warnings
        import numpy as np
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.filterwarnings("always", message="pprobe")
        with warnings.catch_warnings(record=True) as got:
            warnings.filterwarnings("always", message="pprobe")
            np.log(np.array([True, False]))        # log of a bool mask: -inf expected
            np.reciprocal(np.zeros(1))             # allowed by PPROBE_NAN_ALLOW
            np.where(np.array([True]), np.zeros(1) * 0 + np.inf, 0)   # inf arrives as input
            np.full(1, 2.0) * np.nan               # NaN from a scalar argument: on purpose
            np.divide(np.zeros(1), np.zeros(1))    # 0/0 = NaN: the origin
        for w in got:
            print(w.lineno, str(w.message).split(" (")[0])
        """,
        env={"PPROBE_MODE": "stats", "PPROBE_ON_NAN": "warn", "PPROBE_NAN_ALLOW": "*reciprocal"},
    ).check()
    assert r.out.splitlines() == [
        "12 pprobe: first NaN/inf from finite inputs: numpy.divide",
    ], r.out
