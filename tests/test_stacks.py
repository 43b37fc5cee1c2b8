"""Call stacks (PPROBE_STACK_DEPTH): the N innermost program frames of each call, interned (one
``ops.stack_id`` per row), listed by the ``stacks`` view; both engines record the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_script, sql

from pprobe import core

PROG = """
import numpy as np


def bce(p):
    return np.log(p)                          # BCE


def loss(p):
    return bce(p) * 2.0                       # LOSS


def train(n):
    for _ in range(n):
        loss(np.ones(3))                      # TRAIN


def deep(k):
    if k:
        return deep(k - 1)                    # DEEP
    return np.negative(np.ones(2))            # BOTTOM


train(2)                                      # MODULE_TRAIN
deep(5)                                       # MODULE_DEEP
"""


def line_of(marker: str) -> int:
    lines = PROG.splitlines()
    return next(i for i, t in enumerate(lines, 1) if t.rstrip().endswith(f"# {marker}"))


def stacks_by_op(run_dir: Path) -> dict[str, list[list[tuple[int, str]]]]:
    """op -> for each of its rows (in order), its frames as (line, function), innermost first."""
    rows = sql(
        run_dir,
        "SELECT o.seq, o.op, o.caller, o.stack_id, s.level, s.caller AS frame, "
        "s.caller_function AS fn FROM ops o LEFT JOIN stacks s USING (pid, stack_id) "
        "ORDER BY o.seq, s.level",
    )
    out: dict[str, list] = {}
    cur: dict[int, list] = {}
    for r in rows:
        assert r["frame"] is not None, r  # every row's stack is in the view
        if r["level"] == 0:
            assert r["frame"] == r["caller"]  # level 0 is the call site
        frames = cur.setdefault(r["seq"], [])
        if not frames:
            out.setdefault(r["op"], []).append(frames)
        frames.append((int(r["frame"].rsplit(":", 1)[1]), r["fn"]))
    return out


def expected(depth: int) -> dict[str, list[tuple[int, str]]]:
    full = {
        "numpy.log": [(line_of("BCE"), "bce"), (line_of("LOSS"), "loss"),
                      (line_of("TRAIN"), "train"), (line_of("MODULE_TRAIN"), "<module>")],
        "numpy.ndarray.__mul__": [(line_of("LOSS"), "loss"), (line_of("TRAIN"), "train"),
                                  (line_of("MODULE_TRAIN"), "<module>")],
        "numpy.negative": [(line_of("BOTTOM"), "deep")] + [(line_of("DEEP"), "deep")] * 5
        + [(line_of("MODULE_DEEP"), "<module>")],
    }  # fmt: skip
    return {op: frames[:depth] for op, frames in full.items()}


ENGINES = ["python"] + (["native"] if core.native is not None else [])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("depth", [None, 1, 5])
def test_stacks_hold_the_innermost_program_frames(
    tmp_path: Path, engine: str, depth: int | None
) -> None:
    env = {"PPROBE_MODE": "log", "PPROBE_CORE": engine}
    if depth is not None:
        env["PPROBE_STACK_DEPTH"] = str(depth)
    r = run_script(tmp_path, PROG, env=env).check()
    got = stacks_by_op(r.run_dir)
    want = expected(depth or 3)  # 3: the default
    for op, frames in want.items():
        assert got[op] and all(g == frames for g in got[op]), (op, got[op], frames)
    # interned: the same stack is one id, two stacks two ids
    ids = sql(
        r.run_dir,
        "SELECT op, count(DISTINCT stack_id) AS n, count(*) AS c FROM ops "
        "WHERE op IN ('numpy.log', 'numpy.ndarray.__mul__') GROUP BY op",
    )
    assert {(x["op"], x["n"], x["c"]) for x in ids} == {
        ("numpy.log", 1, 2),
        ("numpy.ndarray.__mul__", 1, 2),
    }


@pytest.mark.skipif(core.native is None, reason="the native core is not built")
def test_both_engines_record_the_same_stacks(tmp_path: Path) -> None:
    got = {}
    for engine in ("python", "native"):
        env = {"PPROBE_MODE": "stats", "PPROBE_CORE": engine, "PPROBE_STACK_DEPTH": "4"}
        r = run_script(tmp_path / engine, PROG, env=env).check()
        got[engine] = sql(
            r.run_dir,
            "SELECT o.op, s.level, regexp_extract(s.caller, '[^/]*$') AS caller, "
            "s.caller_function FROM ops o "
            "JOIN stacks s USING (pid, stack_id) ORDER BY o.seq, s.level",
        )
    assert got["python"] == got["native"]
    assert got["python"]


def test_a_bad_depth_names_the_variable(tmp_path: Path) -> None:
    r = run_script(tmp_path, "import numpy as np\nnp.add(1, 2)\n",
                   env={"PPROBE_STACK_DEPTH": "0"})  # fmt: skip
    assert "PPROBE_STACK_DEPTH='0' is not valid" in r.err


# ---------------------------------------------------------------------- in process
def test_stack_interning_chains_frames_innermost_first() -> None:
    from pprobe import recorder

    n = len(recorder.stack_inner)
    keys = set(recorder._stack_ids)
    try:
        a = recorder._stack_id(-1, 10_001)
        b = recorder._stack_id(a, 10_002)
        assert recorder._stack_id(-1, 10_001) == a and recorder._stack_id(a, 10_002) == b
        assert (recorder.stack_inner[b], recorder.stack_outer[b]) == (a, 10_002)
        assert recorder.stack_site[b] == recorder.stack_site[a] == 10_001  # the call site
        assert recorder._stack_id(-1, 10_002) not in (a, b)
    finally:  # the process's interned stacks as they were
        for arr in (recorder.stack_inner, recorder.stack_outer, recorder.stack_site):
            del arr[n:]
        for k in set(recorder._stack_ids) - keys:
            del recorder._stack_ids[k]


def test_interning_from_many_threads_gives_one_id_each() -> None:
    """New sites and stacks met by threads at once: one id per key, each id's arrays filled
    before any thread can see it (a race here once made 'finding the caller' fail)."""
    import sys
    import threading

    from pprobe import recorder

    codes = [compile(f"x{i} = {i}", f"<interning-{i}>", "exec") for i in range(400)]
    got: dict[int, list[tuple[int, int]]] = {}
    errors: list[BaseException] = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work(t: int) -> None:
        try:
            out = []
            for i, c in enumerate(codes):
                site = recorder._site_id(c, i + 1)
                inner = recorder._stack_id(-1, site)
                sid = recorder._stack_id(inner, site)
                assert recorder.stack_site[sid] == site
                out.append((site, sid))
            got[t] = out
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors
    assert all(got[t] == got[0] for t in got)  # every thread got the same ids
    sites = [s for s, _ in got[0]]
    assert len(set(sites)) == len(codes)
    assert [recorder.sites[s][0] for s in sites] == codes
