"""Dump mode in the native core (issue #10): the core records the call (site, descriptions,
statistics, the row) and hands each array to ``recorder._native_dump`` for its dump, instead
of sending the whole call to the Python engine's ``_begin`` / ``_end``.

What a user sees must not change: the same rows, names, notes and dump contents as the
Python engine writes, byte for byte where the engines share the code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import load_dump, meta, ops, run_script, tensors

NATIVE_BUILT = True
try:
    from pprobe import _native  # noqa: F401
except ImportError:
    NATIVE_BUILT = False

PROG = """
import sys
import numpy as np
rng = np.random.default_rng(3)
a = rng.standard_normal((3, 4))
b = rng.standard_normal((3, 4)) + 2
np.add(a, b)                      # a ufunc
a + b                             # an operator
c = a.copy()
c += 1                            # in place: the input dump holds the value before
a.sum()                           # a method
np.multiply(a, 2.0, out=c)        # out=: a note, no dump
np.empty(3)                       # uninitialised output: a note, no dump
np.divmod(a, b)                   # two outputs: output0, output1
np.linalg.eigh(a @ a.T)           # a tuple result
np.multiply(np.float64(2.5), a)   # a NumPy scalar input
np.asfortranarray(a) * 1          # a Fortran-ordered input
np.array([1, None], dtype=object).copy()  # object dtype: not dumped, says why
for _ in range(3):
    np.negative(b)                # the same content again: stored once
np.clip(a, a_min=-0.5, a_max=b)   # an array keyword argument
np.zeros((1,) * 9).sum(axis=0)    # a deep output (9 dimensions): the Python side
np.split(np.arange(70.0), 70)     # 70 outputs: positions past 63
np.ones(2, dtype=np.float16) * np.float16(3)
x = np.arange(6).reshape(2, 3)
x.T.copy()
np.mean(a)                        # a NumPy scalar output
np.positive(np.float32(-2.25))    # scalar in, scalar out
np.add(np.int8(-3), np.uint16(60000))
np.multiply(np.True_, np.complex64(1 + 2j))
"""

TORCH_PROG = """
import torch
g = torch.Generator().manual_seed(1)
x = torch.randn(4, 3, generator=g)
y = torch.randn(4, 3, generator=g)
torch.add(x, y)
x * y
x.to(torch.bfloat16) + 1
torch.max(x, dim=0)
torch.neg(x.t())                  # a transposed input (and output)
torch.arange(6) * 2               # int64
for _ in range(3):
    torch.neg(y)                  # the same content again: stored once
torch.neg(torch.ones(0, 3))       # no elements
torch.ones((1,) * 9) + 1          # a deep output (9 dimensions): the Python side
z = torch.zeros(4, 3)
z.add_(x)                         # in place: the input's values before, the output's after
w = torch.arange(6.0)
w.resize_(2)                      # the same tensor, another shape after the call
c = torch.randn(3, dtype=torch.complex64, generator=g)
torch.add(c.conj(), 1)            # a conjugate view: not read in place for its dump
torch.stack([x, y] * 9)           # 18 tensors in one call
"""


def _table(run_dir: Path) -> list[tuple]:
    """Each row and its arrays as the engines must agree on them: the dump names without the
    pid, the notes, and the dumps' contents."""
    pid = str(meta(run_dir)["pid"])
    out: list[tuple] = []
    for o in ops(run_dir):
        arrays = []
        for t in tensors(run_dir, f"seq = {o['seq']}"):
            path = t["dump_path"]
            value: Any = None
            if path is not None:
                v = load_dump(run_dir / path)
                value = (str(v.dtype), v.shape, v.tobytes(), bool(v.flags.f_contiguous))
                path = path.replace(f"_{pid}-", "_PID-")
            arrays.append((t["role"], t["idx"], t["shape"], t["dtype"], t["min"], t["max"],
                           t["nan_count"], path, t["note"], value))  # fmt: skip
        caller = Path(o["caller"]).name if o["caller"] else None  # the script's folder differs
        out.append((o["op"], o["kind"], caller, o["status"], o["args"], arrays))
    return out


@pytest.mark.skipif(not NATIVE_BUILT, reason="the native core is not built")
@pytest.mark.parametrize("prog", ["numpy", "torch"])
def test_both_engines_write_the_same_dumps(tmp_path: Path, prog: str) -> None:
    if prog == "torch":
        pytest.importorskip("torch")
    source = PROG if prog == "numpy" else TORCH_PROG
    got = {}
    for engine in ("native", "python"):
        r = run_script(tmp_path / engine, source,
                       env={"PPROBE_CORE": engine, "PPROBE_MODE": "dump"}).check()  # fmt: skip
        m = meta(r.run_dir)
        assert m["core"]["engine"] == engine
        assert not m["errors"], r.err
        got[engine] = _table(r.run_dir)
    for n, p in zip(got["native"], got["python"]):
        assert n == p
    assert len(got["native"]) == len(got["python"])
    rows = got["native"]
    dumped = [a for row in rows for a in row[5] if a[7] is not None]
    assert len(dumped) > (60 if prog == "numpy" else 12)
    if prog == "numpy":
        names = {a[7] for a in dumped}
        assert "op_numpy.divmod_output1_PID-" in " ".join(names)
        assert any(re.search(r"op_numpy.split_output69_PID-\d+\.npy", n) for n in names)
        notes = {a[8] for row in rows for a in row[5]}
        assert "out= buffer" in notes
        assert any(n and n.startswith("uninitialised memory") for n in notes)
        assert any(n and "object dtype" in n for n in notes)
        # a + b and c += 1: each output is its inputs' sum (the inputs' values before the
        # call, also where the call writes into its input)
        adds = [row for row in rows
                if row[0] in ("numpy.ndarray.__add__", "numpy.ndarray.__iadd__")]  # fmt: skip
        assert len(adds) == 3
        for row in adds:
            ins = {a[1]: a[9] for a in row[5] if a[0] == "input"}
            (out,) = [a[9] for a in row[5] if a[0] == "output"]
            x = np.frombuffer(ins["0"][2]).reshape(ins["0"][1])
            if "1" in ins:
                y: Any = np.frombuffer(ins["1"][2]).reshape(ins["1"][1])
            else:  # + 2, += 1: the args say
                assert row[4] in ("1=1", "1=2")
                y = int(row[4][2:])
            assert np.frombuffer(out[2]).reshape(out[1]).tolist() == (x + y).tolist()


@pytest.mark.skipif(not NATIVE_BUILT, reason="the native core is not built")
def test_the_native_core_records_dump_mode_itself(tmp_path: Path) -> None:
    """The core takes dump mode's calls: one _native_dump per array, in the order of the
    call's inputs (before the call) and outputs (kind 1: the one output, 2: one of several).
    The Python engine's path never calls it. A dump that raises costs that array its dump
    only: it is reported, and the row is kept."""
    r = run_script(
        tmp_path,
        """
        import json, sys
        import numpy as np
        from pprobe import _native, core, recorder
        calls = []
        real = recorder._native_dump

        def counting(x, op, seq, kind, idx, header):
            calls.append(kind)
            if len(calls) == 7:  # np.divmod's first input
                raise RuntimeError("a failing dump")
            return real(x, op, seq, kind, idx, header)

        _native.set_dump(counting)
        _native.set_dumper(None)  # no dump made in C: every array comes to the hook
        a = np.arange(4.0)     # one output
        np.add(a, a)           # 2 inputs + 1 output
        np.divmod(a, a + 1)    # a + 1 (an input, an output), then 2 inputs + 2 outputs
        print(json.dumps({"engine": core.ENGINE, "calls": calls}))
        """,
        env={"PPROBE_CORE": "native", "PPROBE_MODE": "dump"},
    ).check()
    import json

    out = json.loads(r.out.strip().splitlines()[-1])
    assert out["engine"] == "native"
    assert out["calls"] == [1, 0, 0, 1, 0, 1, 0, 0, 2, 2]
    m = meta(r.run_dir)
    assert any("writing dumps" in e.get("where", str(e)) for e in m["errors"]), m["errors"]
    (dm,) = ops(r.run_dir, "op = 'numpy.divmod'")
    ts = tensors(r.run_dir, f"seq = {dm['seq']}")
    paths = {(t["role"], t["idx"]): t["dump_path"] for t in ts}
    assert paths[("input", "0")] is None  # the raising one: no dump, the row is kept
    assert paths[("input", "1")] and paths[("output", "0")] and paths[("output", "1")]


@pytest.mark.skipif(not NATIVE_BUILT, reason="the native core is not built")
def test_the_cores_npy_headers_are_pythons(tmp_path: Path) -> None:
    """The .npy header the core makes for an ndarray of a builtin numeric dtype is
    dumps.npy_header's, byte for byte; other dtypes and deep shapes are left to Python."""
    r = run_script(
        tmp_path,
        """
        import numpy as np
        from numpy.lib.stride_tricks import as_strided
        from pprobe import _native, dumps
        made = 0
        shapes = [(), (3,), (3, 4), (1,) * 8, (0,), (2**40, 1), (123456789, 3, 2), (1,) * 9]
        for dt in [*"?bBhHiIlLqQefdgFDG", "O", "S3", "U2", "M8[ns]", "m8", ">f8", "V4"]:
            for shape in shapes:
                a = as_strided(np.zeros((1,) * len(shape), dtype=dt), shape, (0,) * len(shape))
                h = _native.npy_header(a)
                if len(dt) > 1 or dt == "O" or len(shape) > 8:
                    assert h is None, (dt, shape, h)
                else:
                    assert h == dumps.npy_header(a.dtype, a.shape), (dt, shape, h)
                    made += 1
        for dt in "?bHifdFD":  # Fortran-ordered arrays: their memory, np.save's header
            for a in (np.asfortranarray(np.zeros((3, 4), dt)), np.zeros((2, 3, 4), dt).T,
                      np.zeros((4, 1), dt).T, np.zeros((5, 6), dt)[:, ::2]):
                h = _native.npy_header(a)
                assert h == dumps.npy_header(a.dtype, a.shape, dumps.fortran_order(a)), h
                assert (b"'fortran_order': True" in h) == (a.ndim > 1 and a.flags.f_contiguous
                                                           and not a.flags.c_contiguous), h
                made += 1
        assert _native.npy_header(np.float64(2.0)) is None
        assert _native.npy_header(np.ma.masked_array([1.0])) is None  # subclasses: Python's
        assert _native.npy_header([1.0]) is None
        print(made)
        """,
        env={"PPROBE_CORE": "native", "PPROBE_MODE": "log"},
    ).check()
    assert r.out.strip().splitlines()[-1] == "158"


@pytest.mark.skipif(not NATIVE_BUILT, reason="the native core is not built")
def test_the_core_makes_plain_dumps_itself_and_leaves_the_rest_to_python(tmp_path: Path) -> None:
    """A C-contiguous or Fortran-ordered plain ndarray of a numeric dtype is dumped by the
    core (the twin of Dumper._dump, with the dumper's own lock, seen contents and budget
    counters; a Fortran-ordered one as its memory, under np.save's Fortran-order header); the
    first dump of the process (the content hash is chosen there), a strided array and a
    subclass go to recorder._native_dump. A dump past the budget chunks held stays in the core,
    which has Dumper._reserve take the next ones. Names, dedup and the budget's accounting
    are the same either way."""
    r = run_script(
        tmp_path,
        """
        import json
        import numpy as np
        from pprobe import recorder
        from pprobe.session import Session
        calls = []
        real = recorder._native_dump

        def counting(x, op, seq, kind, idx, header):
            calls.append(type(x).__name__ + ("F" if x.flags.f_contiguous and x.ndim > 1
                                              and not x.flags.c_contiguous else ""))
            return real(x, op, seq, kind, idx, header)

        from pprobe import _native
        _native.set_dump(counting)
        a = np.arange(12.0).reshape(3, 4)   # first dump: Python (the hash is chosen)
        n0 = len(calls)
        b = a + 1                            # plain: the core
        c = a + 1                            # the same content: an alias, made by the core
        np.negative(a.T)                     # a Fortran-ordered input: the core
        np.negative(a[:, ::2])               # strided: Python
        np.negative(np.ma.masked_array(a))   # a subclass: Python
        d = Session.active.dumper
        held = d.held
        big = np.ones(300_000)               # 2.4 MB: past the chunk held (1 MiB): the core
        print(json.dumps({"n0": n0, "calls": calls[n0:], "linked": d.linked,
                          "used": d.used, "held": d.held, "held_before": held}))
        """,
        env={"PPROBE_CORE": "native", "PPROBE_MODE": "dump", "PPROBE_BUDGET": "64MB"},
    ).check()
    import json

    out = json.loads(r.out.strip().splitlines()[-1])
    assert out["n0"] == 1
    # a + 1, a + 1, a.T in and its output (NumPy keeps the Fortran order): none; a[:, ::2]
    # (its output is C-ordered: the core); the masked array in and out; not np.ones' output
    assert out["calls"] == ["ndarray", "MaskedArray", "MaskedArray"], out
    assert out["linked"] >= 2  # c's inputs and output repeat b's
    assert 0 < out["used"] <= out["held"]
    # np.ones' output took three more 1 MiB chunks (64 MB / 64), claimed from the core
    assert out["held"] - out["held_before"] >= 300_000 * 8 - (1 << 20), out
    assert out["used"] > 300_000 * 8, out
    rows = ops(r.run_dir)
    paths = [t["dump_path"] for o in rows for t in tensors(r.run_dir, f"seq = {o['seq']}")]
    assert all(paths), paths
    pid = meta(r.run_dir)["pid"]
    adds = [o for o in rows if o["op"] == "numpy.ndarray.__add__"]
    for o in adds:
        (out_t,) = tensors(r.run_dir, f"seq = {o['seq']} AND role = 'output'")
        assert out_t["dump_path"] == f"op_numpy.ndarray.__add___output_{pid}-{o['seq']}.npy"
        np.testing.assert_array_equal(load_dump(r.run_dir / out_t["dump_path"]),
                                      np.arange(12.0).reshape(3, 4) + 1)  # fmt: skip
    (neg,) = [o for o in rows if o["op"] == "numpy.negative"][:1]
    got = {t["role"]: load_dump(r.run_dir / t["dump_path"])
           for t in tensors(r.run_dir, f"seq = {neg['seq']}")}  # fmt: skip
    a_t = np.arange(12.0).reshape(3, 4).T
    for role, want in (("input", a_t), ("output", -a_t)):
        assert got[role].flags.f_contiguous and not got[role].flags.c_contiguous, role
        np.testing.assert_array_equal(got[role], want)
    assert not meta(r.run_dir)["errors"], r.err


@pytest.mark.skipif(not NATIVE_BUILT, reason="the native core is not built")
def test_the_core_sees_each_change_of_the_dumper_at_its_next_dump(tmp_path: Path) -> None:
    """The core reads the dumper's lock, seen contents, budget counters and digest function
    once per state of the dumper (Dumper._view numbers them), not at every dump. Stopping the
    dumps (the budget used up, a full disk) reaches its very next dump, and so does a new seen
    dict, lock and counters (Dumper._reset, as a forked child's dumper does). Once dumping has
    stopped for good, the core gives each dump the dumper's note itself (Dumper.stop_note),
    with no call into Python: a long run spends most of its steps past its budget."""
    r = run_script(
        tmp_path,
        """
        import json
        import numpy as np
        from pprobe import recorder
        from pprobe.dumps import Dumper
        from pprobe.session import Session
        calls = []
        real = recorder._native_dump

        def counting(x, op, seq, kind, idx, header):
            calls.append(op)
            return real(x, op, seq, kind, idx, header)

        asked = []
        real_dump = Dumper.dump

        def dump(self, *a, **k):
            asked.append(1)
            return real_dump(self, *a, **k)

        Dumper.dump = dump
        from pprobe import _native
        _native.set_dump(counting)
        d = Session.active.dumper
        a = np.arange(12.0)
        np.negative(a)                # the first dump (Python), then the core's
        np.negative(a + 1)
        core, asked0 = len(calls), len(asked)
        d.disk_full = "not dumped: no space (a test)"
        np.negative(a + 2)            # FULL: each dump says why, no file, no call
        full = len(calls) - core, len(asked) - asked0
        d.disk_full = ""
        d._reset()                    # new seen, counters: the core takes them
        held0 = d.held
        np.negative(a + 3)
        after = len(calls) - core
        fresh = len(d.seen), d.used, held0
        d.exhausted = True
        np.negative(a + 4)            # EXHAUSTED
        print(json.dumps({"core": core, "full": full, "after": after, "fresh": fresh,
                          "exhausted": (len(calls) - core - after, len(asked) - asked0)}))
        """,
        env={"PPROBE_CORE": "native", "PPROBE_MODE": "dump", "PPROBE_BUDGET": "64MB"},
    ).check()
    import json

    out = json.loads(r.out.strip().splitlines()[-1])
    assert out["core"] == 1, out  # only the process's first dump
    assert out["full"] == [0, 0], out  # neither the core's Python half nor Dumper.dump
    # after _reset: the first dump takes a budget chunk in the core, and the core fills the
    # new seen dict and counters (nothing reached Python)
    assert out["after"] == 0, out
    seen, used, held0 = out["fresh"]
    assert held0 == 0 and used > 0 and seen >= 2, out
    assert out["exhausted"] == [0, 0], out
    src = (tmp_path / "prog.py").read_text().splitlines()
    line = {tag: next(i for i, t in enumerate(src, 1) if f"# {tag}" in t)
            for tag in ("FULL", "EXHAUSTED")}  # fmt: skip
    by_line: dict[int, list] = {}
    for o in ops(r.run_dir):
        by_line.setdefault(int(o["caller"].rsplit(":", 1)[1]), []).extend(
            tensors(r.run_dir, f"seq = {o['seq']}")
        )
    for tag, note in (("FULL", "not dumped: no space (a test)"),
                      ("EXHAUSTED", "not dumped: dump budget exhausted")):  # fmt: skip
        rows = by_line[line[tag]]
        assert len(rows) >= 4, rows  # a + k's input and output, np.negative's
        assert all(t["note"] == note and t["dump_path"] is None for t in rows), rows
    # and the others were dumped
    assert all(t["dump_path"] for k, v in by_line.items() if k not in line.values() for t in v)


@pytest.mark.skipif(not NATIVE_BUILT, reason="the native core is not built")
def test_the_core_dumps_numpy_scalars_itself(tmp_path: Path) -> None:
    """A NumPy scalar of a builtin numeric type (an input such as ``LR * g``'s, or np.mean's
    result) is dumped by the core from its bytes as a 0-d array of its dtype, what the Python
    side's np.asarray makes; long double (padding bytes that are not the value's) and the
    first dumps of the process go to recorder._native_dump."""
    r = run_script(
        tmp_path,
        """
        import json
        import numpy as np
        from pprobe import _native, recorder
        calls = []
        real = recorder._native_dump

        def counting(x, *rest):
            calls.append(type(x).__name__)
            return real(x, *rest)

        _native.set_dump(counting)
        a = np.arange(24.0).reshape(4, 6)
        np.add(a, 1)                     # the first dumps: Python (set-up)
        n0 = len(calls)
        vals = [np.float16(1.5), np.float32(-2.25), np.float64(3.0), np.True_, np.int8(-3),
                np.uint8(200), np.int16(-300), np.uint16(60000), np.int32(-7),
                np.uint32(4000000000), np.int64(-2**40), np.uint64(2**63 + 5),
                np.complex64(1 + 2j), np.complex128(-3 + 0.5j), np.float64(np.nan)]
        for v in vals:
            np.maximum(v, v)             # scalars in, a scalar out: the core
        np.mean(a)                       # a scalar out
        np.multiply(np.longdouble(3), 2) # long double: Python
        print(json.dumps({"n0": n0, "calls": calls[n0:]}))
        """,
        env={"PPROBE_CORE": "native", "PPROBE_MODE": "dump"},
    ).check()
    import json

    out = json.loads(r.out.strip().splitlines()[-1])
    assert 0 < out["n0"] <= 3
    assert out["calls"] == ["longdouble", "longdouble"]
    vals = [np.float16(1.5), np.float32(-2.25), np.float64(3.0), np.True_, np.int8(-3),
            np.uint8(200), np.int16(-300), np.uint16(60000), np.int32(-7),
            np.uint32(4000000000), np.int64(-(2**40)), np.uint64(2**63 + 5),
            np.complex64(1 + 2j), np.complex128(-3 + 0.5j), np.float64(np.nan)]  # fmt: skip
    rows = [o for o in ops(r.run_dir) if o["op"] == "numpy.maximum"]
    assert len(rows) == len(vals)
    for o, v in zip(rows, vals):
        ts = tensors(r.run_dir, f"seq = {o['seq']}")
        assert [t["role"] for t in ts] == ["input", "input", "output"]
        for t in ts:
            got = load_dump(r.run_dir / t["dump_path"])
            want = np.asarray(v)
            assert got.dtype == want.dtype and got.shape == () and t["shape"] == []
            assert got.tobytes() == want.tobytes(), (t["dump_path"], got, v)
    (mean,) = [o for o in ops(r.run_dir) if o["op"] == "numpy.mean"]
    (out_row,) = tensors(r.run_dir, f"seq = {mean['seq']} AND role = 'output'")
    assert load_dump(r.run_dir / out_row["dump_path"]) == np.float64(11.5)
    (ld,) = [o for o in ops(r.run_dir) if o["op"] == "numpy.multiply"]
    for t in tensors(r.run_dir, f"seq = {ld['seq']}"):
        got = load_dump(r.run_dir / t["dump_path"])
        assert got.dtype == np.longdouble and got == np.longdouble(3 if t["role"] == "input" else 6)
    assert not meta(r.run_dir)["errors"], r.err


@pytest.mark.skipif(not NATIVE_BUILT, reason="the native core is not built")
def test_the_core_dumps_plain_cpu_tensors_itself(tmp_path: Path) -> None:
    """A plain C-contiguous CPU tensor of a NumPy dtype is dumped by the core from its memory
    (what torch_values.dumpable reads through host_array); a transposed tensor, a bfloat16
    one (saved as its bits, tagged), an empty one and the first dump of the process go to
    recorder._native_dump. The dumps hold the tensors' values, and repeats are aliases."""
    pytest.importorskip("torch")
    r = run_script(
        tmp_path,
        """
        import json
        import torch
        from pprobe import _native, recorder
        from pprobe.session import Session
        calls = []
        real = recorder._native_dump

        def counting(x, op, seq, kind, idx, header):
            t = type(x).__name__
            if t == "Tensor":
                t += ":" + str(x.dtype).replace("torch.", "")
                t += "" if x.is_contiguous() else ":strided"
                t += "" if x.numel() else ":empty"
            calls.append(t)
            return real(x, op, seq, kind, idx, header)

        _native.set_dump(counting)
        x = torch.arange(24.0).reshape(4, 6)  # the first dumps: Python (set-up)
        n0 = len(calls)
        y = x + 1                              # plain float32: the core
        z = x + 1                              # the same content (64 bytes and more): aliases
        torch.arange(6) * 2                    # int64: the core
        torch.neg(x.t())                       # transposed: Python (the view and neg's)
        x.to(torch.bfloat16) + 1               # bfloat16: Python
        torch.neg(torch.ones(0, 3))            # no elements: Python
        d = Session.active.dumper
        print(json.dumps({"n0": n0, "calls": calls[n0:], "linked": d.linked}))
        """,
        env={"PPROBE_CORE": "native", "PPROBE_MODE": "dump"},
    ).check()
    import json

    out = json.loads(r.out.strip().splitlines()[-1])
    calls = out["calls"]
    assert 0 < out["n0"] <= 4
    # Tensor.t's output and neg's input and output; .to's output, the add's input and output;
    # ones' output and neg's input and output
    assert calls.count("Tensor:float32:strided") == 3, calls
    assert calls.count("Tensor:bfloat16") == 3, calls
    assert calls.count("Tensor:float32:empty") == 3, calls
    assert len(calls) == 9, calls  # nothing else: the plain tensors were the core's
    assert out["linked"] >= 3  # z = x + 1 repeats y's input and output
    rows = ops(r.run_dir)
    pid = meta(r.run_dir)["pid"]
    adds = [o for o in rows if o["op"] == "torch.Tensor.add"][:2]
    for o in adds:
        (out_t,) = tensors(r.run_dir, f"seq = {o['seq']} AND role = 'output'")
        assert out_t["dump_path"] == f"op_torch.Tensor.add_output_{pid}-{o['seq']}.npy"
        want = np.arange(24.0, dtype=np.float32).reshape(4, 6) + 1
        np.testing.assert_array_equal(load_dump(r.run_dir / out_t["dump_path"]), want)
    (mul,) = [o for o in rows if o["op"] == "torch.Tensor.mul"]
    (mul_out,) = tensors(r.run_dir, f"seq = {mul['seq']} AND role = 'output'")
    assert load_dump(r.run_dir / mul_out["dump_path"]).tolist() == [0, 2, 4, 6, 8, 10]
    assert not meta(r.run_dir)["errors"], r.err


MEMO_PROG = """
import numpy as np
rng = np.random.default_rng(5)
w = rng.standard_normal((64, 48)).astype(np.float32)      # 12 KB: statistics kept by content
x = rng.standard_normal((32, 64)).astype(np.float32)
for step in range(3):
    h = np.dot(x, w)                  # h: an output, then the next op's input (seen before)
    r = np.maximum(h, 0)
    g = np.dot(r, w.T)                # w.T: a transpose, the same memory as w
    w -= 0.1 * np.dot(x.T, r)         # w changes in place: its next content is new
big = np.arange(2048, dtype=np.float64)
np.negative(big)
np.negative(big.view(np.int64))       # the same bytes, another dtype
np.negative(big.byteswap().view(big.dtype.newbyteorder()))  # the same values, swapped bytes
sw = big.view(big.dtype.newbyteorder())
np.negative(sw)                       # the same bytes as big, other values (byte-swapped)
nan = big.copy()
nan[::7] = np.nan
nan[3] = np.inf
np.negative(nan)
np.negative(nan.copy())               # the same content: its NaN and inf counts too
f = np.asfortranarray(rng.standard_normal((40, 30)))
np.negative(f)
np.negative(f.T)                      # C-ordered view of the same memory
np.negative(np.ascontiguousarray(f.T))
"""


TORCH_MEMO_PROG = """
import torch
g = torch.Generator().manual_seed(2)
w = torch.randn(64, 48, generator=g)
x = torch.randn(32, 64, generator=g)
for step in range(3):
    h = torch.mm(x, w)
    r = torch.relu(h)
    w.sub_(0.1 * torch.mm(x.t(), r))
big = torch.arange(2048, dtype=torch.float64)
torch.neg(big)
torch.neg(big.view(torch.int64))                  # the same bytes, another dtype
torch.neg(big.to(torch.float32).view(torch.int32))  # float32 bits as int32
nan = big.clone()
nan[::7] = float("nan")
nan[3] = float("inf")
torch.neg(nan)
torch.neg(nan.clone())
torch.neg(big.to(torch.bfloat16))
torch.neg(big.to(torch.bfloat16).view(torch.float16))  # the same bytes as float16
"""


@pytest.mark.skipif(not NATIVE_BUILT, reason="the native core is not built")
@pytest.mark.parametrize("prog", ["numpy", "torch"])
def test_statistics_kept_by_content_are_the_contents_statistics(tmp_path: Path, prog: str) -> None:
    """In dump mode the native core takes the statistics of a content seen before (same
    digest and dtype) from its table instead of reading the array again. Every statistic must
    be, to the last bit, the one it computes for that array without the table: across repeated
    contents, in-place changes, transposes, other dtypes and byte-swapped views of the same
    bytes, NaN and inf. The table is used where the core makes the dumps itself
    (PPROBE_DUMP_FULL=wait, the default); with skip, Python makes them and every array's
    statistics are computed (still in C)."""
    if prog == "torch":
        pytest.importorskip("torch")
    got, links = {}, {}
    for full in ("wait", "skip"):
        r = run_script(tmp_path / full, MEMO_PROG if prog == "numpy" else TORCH_MEMO_PROG,
                       env={"PPROBE_CORE": "native", "PPROBE_MODE": "dump",
                            "PPROBE_DUMP_FULL": full}).check()  # fmt: skip
        m = meta(r.run_dir)
        assert m["core"]["engine"] == "native" and not m["errors"], r.err
        assert m["dumps"]["skipped"] == 0
        links[full] = m["dumps"]["links"]  # the kept digests are the dumps' digests
        cols = ("role", "idx", "shape", "dtype", "min", "max", "mean", "std", "nan_count",
                "inf_count", "note")  # fmt: skip
        got[full] = [
            (o["op"], *(t[c] for c in cols))
            for o in ops(r.run_dir)
            for t in tensors(r.run_dir, f"seq = {o['seq']}")
        ]
    assert got["wait"] == got["skip"]
    assert links["wait"] == links["skip"] > 0
    rows = got["wait"]
    if prog == "torch":
        negs = [t for t in rows if t[0] == "torch.neg" and t[1] == "input"]
        assert len(negs) == 7
        assert len({t[5:11] for t in negs[:3]}) == 3
        assert negs[3][9:11] == negs[4][9:11] == (293, 1)
        assert negs[5][5:11] != negs[6][5:11]
        mms = [
            t
            for t in rows
            if t[0] in ("torch.mm", "torch.spmm") and t[1] == "input" and t[3] == [64, 48]
        ]
        assert len({t[5:9] for t in mms}) == 3
        return
    assert len(rows) > 40
    negs = [t for t in rows if t[0] == "numpy.negative" and t[1] == "input"]
    assert len(negs) == 9
    # big's bytes as float64, as int64 and byte-swapped: three sets of statistics (the table
    # tells them apart); big's values in swapped bytes: big's min and max
    assert len({t[5:11] for t in (negs[0], negs[1], negs[3])}) == 3
    assert negs[2][5:7] == negs[0][5:7] == (0.0, 2047.0)
    assert negs[4][9:11] == negs[5][9:11] == (293, 1)
    # w's content changes every step: three different weights, each with its own statistics
    dots = [t for t in rows if t[0] == "numpy.dot" and t[1] == "input" and t[3] == [64, 48]]
    assert len({t[5:9] for t in dots}) == 3
