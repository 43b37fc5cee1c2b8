"""Running probed programs in subprocesses and reading what they left.

Every end-to-end test writes a script into ``tmp_path``, runs it through one of pprobe's entry
points (``PYTHONPATH=bootstrap``, ``python -m pprobe run``, a venv, a site-packages .pth) with
``PPROBE_OUTPUT`` pointing into ``tmp_path``, then reads the run folder with
:func:`pprobe.query.run_sql` / :func:`pprobe.query.load_tables` and ``np.load``.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BOOTSTRAP = REPO / "bootstrap"
TESTS_DIR = REPO / "tests"
PYTHON = sys.executable

#: Variables a test never inherits from the shell that runs pytest.
_DROP = ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "RANK", "WORLD_SIZE")


def clean_env(**extra: str | None) -> dict[str, str]:
    """os.environ without PPROBE_* (but PPROBE_CORE) and PYTHON* start-up variables, plus
    ``extra`` (None drops)."""
    env = {
        k: v
        for k, v in os.environ.items()
        # PPROBE_CORE (the engine this test session runs) is passed on to the children, and
        # PPROBE_DUMP_PACK where a test module sets it (tests of the one-file-per-dump storage)
        if k in ("PPROBE_CORE", "PPROBE_DUMP_PACK")
        or not (k == "PPROBE" or k.startswith("PPROBE_"))
        and k not in _DROP
    }
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


@dataclass
class Result:
    rc: int
    out: str
    err: str
    output: Path  # the PPROBE_OUTPUT folder

    @property
    def runs(self) -> list[Path]:
        """Run folders under the output folder, oldest first."""
        if not self.output.is_dir():
            return []
        return sorted(
            (p for p in self.output.iterdir() if p.is_dir() and not p.is_symlink()),
            key=lambda p: p.stat().st_mtime_ns,
        )

    @property
    def run_dir(self) -> Path:
        """The latest run; a run that recorded no op does not become latest, so where there is
        no `latest`, the newest run folder."""
        latest = self.output / "latest"
        if not latest.exists() and self.runs:
            return self.runs[-1]
        assert latest.exists(), (
            f"no run folder in {self.output}\nstdout:{self.out}\nstderr:{self.err}"
        )
        return latest.resolve()

    def pprobe_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("pprobe")]

    def check(self, rc: int = 0) -> Result:
        assert self.rc == rc, f"exit {self.rc} != {rc}\nstdout:\n{self.out}\nstderr:\n{self.err}"
        return self


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def run(
    cmd: list[str],
    tmp_path: Path,
    *,
    env: dict[str, str | None] | None = None,
    output: Path | None = None,
    cwd: Path | None = None,
    probe: bool = True,
    timeout: float = 120,
    **kw: Any,
) -> Result:
    """Run ``cmd``; with ``probe`` the bootstrap folder is first on PYTHONPATH."""
    output = output if output is not None else tmp_path / "out"
    # Full coverage (the default) unless a test asks for namespace coverage (the fallback).
    e = clean_env(PPROBE_OUTPUT=str(output))
    if probe:
        e["PYTHONPATH"] = str(BOOTSTRAP)
    for k, v in (env or {}).items():  # None removes a variable
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    p = subprocess.run(
        cmd,
        cwd=str(cwd or tmp_path),
        env=e,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )
    return Result(p.returncode, p.stdout, p.stderr, output)


def run_script(
    tmp_path: Path,
    source: str,
    *args: str,
    name: str = "prog.py",
    python: str = PYTHON,
    **kw: Any,
) -> Result:
    """Write ``source`` (dedented) to tmp_path/name and run it with ``python``."""
    script = write(tmp_path / name, source)
    return run([python, str(script), *args], tmp_path, **kw)


def sql(run_dir: Path | str, query: str) -> list[dict[str, Any]]:
    """Rows of one query over a run's views, as dicts."""
    from pprobe.query import run_sql

    cols, rows = run_sql(query, str(run_dir))
    return [dict(zip(cols, r)) for r in rows]


def ops(run_dir: Path | str, where: str = "true") -> list[dict[str, Any]]:
    return sql(run_dir, f"SELECT * FROM ops WHERE {where} ORDER BY pid, seq")


def op_names(run_dir: Path | str, where: str = "true") -> list[str]:
    return [r["op"] for r in ops(run_dir, where)]


def tensors(run_dir: Path | str, where: str = "true") -> list[dict[str, Any]]:
    return sql(run_dir, f"SELECT * FROM tensors WHERE {where} ORDER BY pid, seq, role, idx")


def meta(run_dir: Path | str) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "meta.json").read_text())


def npy_files(run_dir: Path | str) -> list[str]:
    """The names of the run's .npy dumps: files, and entries of its pack files (small dumps,
    PPROBE_DUMP_PACK)."""
    from pprobe import packs

    files = {os.path.basename(p) for p in glob.glob(os.path.join(str(run_dir), "*.npy"))}
    return sorted(files | {n for n in packs.names(str(run_dir)) if n.endswith(".npy")})


def load_dump(path: Path | str) -> Any:
    """A dump as ``numpy.load`` gives a file: a .npy file or an entry of its folder's pack
    files (small dumps, PPROBE_DUMP_PACK), read by pprobe.codecs.load."""
    from pprobe import codecs

    return codecs.load(path)


def shard_pids(run_dir: Path | str, table: str = "ops") -> set[int]:
    """pids that own a shard of ``table`` (from the file names ``{table}-{host}-{pid}.arrows``)."""
    return {
        int(Path(p).stem.rsplit("-", 1)[1])
        for p in glob.glob(os.path.join(str(run_dir), "log", f"{table}-*.arrows"))
    }


# ---------------------------------------------------------------------------------------------
# The transparency battery: run with and without the probe, every entry must be bit-identical.
def _user_classes() -> dict[str, Any]:
    import numpy as np

    class MyArr(np.ndarray):
        def __array_finalize__(self, obj: Any) -> None:
            self.tag = getattr(obj, "tag", "fresh")

    class Vec(np.ndarray):
        total = np.sum  # numpy functions stored on a class bind like methods
        norm = np.linalg.norm
        plus = np.add  # ufuncs do not bind

    class UFuncUser:
        def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kw: Any) -> Any:
            table = {np.add: "add-handler", np.multiply: "mul-handler"}
            return (
                "array_ufunc",
                ufunc.__name__,
                method,
                ufunc == np.add,
                table.get(ufunc),
                len(inputs),
                sorted(kw),
            )

    class FuncUser:
        HANDLED = {np.sum: "sum-handler", np.concatenate: "concat-handler"}

        def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
            return (
                "array_function",
                func.__name__,
                func == np.sum,
                self.HANDLED.get(func),
                sorted(t.__name__ for t in types),
                sorted(kwargs),
            )

    class Defer:
        __array_ufunc__ = None

        def __radd__(self, other: Any) -> str:
            return "deferred"

    return {"MyArr": MyArr, "Vec": Vec, "UF": UFuncUser, "AF": FuncUser, "Defer": Defer}


def battery() -> dict[str, bytes]:
    """name -> pickled result (or the exception's type and message, or its warnings)."""
    import copy
    import fractions
    import functools
    import inspect
    import pickle
    import warnings

    import numpy as np

    c = _user_classes()
    out: dict[str, bytes] = {}

    def case(name: str, fn: Any) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                value = fn()
            except Exception as e:
                value = ("raised", type(e).__module__, type(e).__qualname__, str(e))
        value = (value, [(w.category.__name__, str(w.message)) for w in caught])
        try:
            out[name] = pickle.dumps(value, protocol=4)
        except Exception as e:  # not picklable: compare a description instead
            out[name] = repr(("unpicklable", type(e).__name__, _describe(value))).encode()

    a = np.array([1.5, -2.0, 3.25])
    b = np.array([0.5, 4.0, -1.0])
    m2 = np.arange(12.0).reshape(3, 4)

    def with_out() -> Any:
        o = np.zeros(3)
        r = np.add(a, b, out=o)
        return r, r is o, o

    def with_out_tuple() -> Any:
        o1, o2 = np.empty(3), np.empty(3)
        r = np.divmod(a, b, out=(o1, o2))
        return r, r[0] is o1, r[1] is o2

    def with_where() -> Any:
        o = np.full(3, -7.0)
        np.add(a, b, out=o, where=np.array([True, False, True]))
        return o

    def in_place() -> Any:
        x = a.copy()
        np.multiply(x, 2, out=x)
        np.add.at(x, [0, 0, 2], 1.0)
        np.negative(x[:2], out=x[1:])
        y = m2.copy()
        np.copyto(y, 5.0, where=y > 6)
        np.put(y, [0, 1], [-1.0, -2.0])
        np.fill_diagonal(y, 9.0)
        np.place(y, y < 0, [42.0])
        np.putmask(y, y == 5.0, 0.5)
        z = np.arange(5)
        np.add(z, 1, out=z, casting="unsafe")
        return x, y, z

    def ufunc_methods() -> Any:
        return (
            np.add.reduce(m2, axis=1, keepdims=True),
            np.add.reduce(m2, axis=0, where=m2 > 3, initial=1.0),
            np.multiply.accumulate(a),
            np.add.reduceat(np.arange(8), [0, 4, 1, 5]),
            np.subtract.outer(a, b),
            np.maximum.reduce(m2, axis=None),
            np.add.reduce([], initial=0.0),
            np.add.nin,
            np.add.nout,
            np.add.identity,
            np.add.types,
            np.matmul.signature,
            np.add.ntypes,
        )

    def zero_d() -> Any:
        r = [
            np.add(np.float64(1.5), 2),
            np.add(1, 2),
            np.sum(np.array(3)),
            np.negative(np.array(2.0)),
            np.add(np.array(1.0), np.array(2.0)),
            np.sqrt(np.float32(4)),
            np.mean(np.array(5.0)),
            np.add(np.array(1.0), 1, out=np.array(0.0)),
        ]
        return [(type(x).__name__, x) for x in r]

    def objects() -> Any:
        o = np.array([fractions.Fraction(1, 3), 2.5, 7], dtype=object)
        return (
            np.add(o, o),
            np.sum(o),
            np.concatenate([o, o]),
            np.multiply.reduce(o),
            np.sort(np.array(["b", "a", None], dtype=object)[:2]),
            np.array([[1], "x"], dtype=object).shape,
        )

    def structured() -> Any:
        s = np.array([(1.0, 2), (0.5, 1), (0.5, 0)], dtype=[("x", "f4"), ("y", "i2")])
        return (
            np.sort(s, order=["x", "y"]),
            np.concatenate([s, s]),
            np.unique(s["y"]),
            np.argsort(s, order="y"),
            np.where(s["x"] > 0.6, s["y"], -1),
            s.dtype.descr,
        )

    def masked() -> Any:
        ma = np.ma.masked_array([1.0, 2.0, 3.0, -1.0], mask=[0, 1, 0, 0])
        r = (
            np.add(ma, 1),
            np.sqrt(ma),
            np.mean(ma),
            np.sum(ma),
            np.ma.sum(ma),
            np.concatenate([ma, ma]),
            np.ma.concatenate([ma, ma]),
            np.ma.masked_where(ma > 2, ma),
            np.multiply.reduce(ma),
        )
        return [(type(x).__name__, np.ma.getdata(x), np.ma.getmaskarray(x)) for x in r]

    def matrix() -> Any:
        mt = np.matrix([[1.0, 2.0], [3.0, 4.0]])
        r = (
            np.multiply(mt, mt),
            np.dot(mt, mt),
            np.sum(mt, axis=0),
            np.mean(mt),
            np.linalg.inv(mt),
            np.add.reduce(mt, axis=1),
            np.concatenate([mt, mt]),
            mt * mt,
        )
        return [(type(x).__name__, x) for x in r]

    def subclass() -> Any:
        v = np.arange(3.0).view(c["MyArr"])
        v.tag = "user-tag"
        r = (np.add(v, 1), np.sum(v), np.concatenate([v, v]), np.sqrt(v), np.mean(v))
        return [(type(x).__name__, getattr(x, "tag", None), np.asarray(x)) for x in r]

    def bound_on_class() -> Any:
        v = np.arange(1.0, 4.0).view(c["Vec"])
        return float(v.total()), float(v.norm()), v.plus(1, 2), type(v.total).__name__

    def errors() -> list:
        res = []
        for fn in (
            lambda: np.add(np.ones(3), np.ones(4)),
            lambda: np.concatenate([np.ones((2, 2)), np.ones(3)]),
            lambda: np.linalg.inv(np.zeros((2, 2))),
            lambda: np.reshape(np.ones(3), (2, 2)),
            lambda: np.add(np.array(["a"]), 1),
            lambda: np.sum(np.ones(3), axis=5),
            lambda: np.add(1, 2, 3, 4),
            lambda: np.add.reduce(np.ones(3), axis=3),
            lambda: np.add(np.ones(3), c["Defer"]()),
            lambda: np.sum(),
            lambda: np.matmul(np.ones((2, 3)), np.ones((2, 3))),
        ):
            try:
                fn()
                res.append("no error")
            except Exception as e:
                back = pickle.loads(pickle.dumps(e))  # e.g. multiprocessing sends it back
                res.append(
                    (type(e).__module__, type(e).__qualname__, str(e), repr(e.args), repr(back))
                )
        with np.errstate(invalid="raise"):
            try:
                np.sqrt(np.array(-1.0))
            except FloatingPointError as e:
                res.append(("fpe", str(e)))
        return res

    def warned() -> Any:
        return (
            np.log(np.zeros(2)),
            np.mean(np.array([])),
            np.nanmean(np.array([np.nan])),
            np.divide(np.ones(1), 0),
        )

    def introspection() -> Any:
        return (
            isinstance(np.add, np.ufunc),
            isinstance(np.sum, type(np.concatenate)),
            callable(np.add),
            np.add.__name__,
            np.sum.__name__,
            np.sum.__qualname__,
            np.sum.__module__,
            np.linalg.norm.__module__,
            np.add.__doc__,
            np.sum.__doc__,
            np.fft.fft.__doc__,
            np.add.reduce.__doc__,
            np.add.reduce.__name__,
            str(inspect.signature(np.sum)),
            str(inspect.signature(np.add)),
            str(inspect.signature(np.linalg.norm)),
            str(inspect.signature(np.add.reduce)),
            inspect.isfunction(np.sum),
            inspect.isbuiltin(np.add),
            inspect.isroutine(np.ma.concatenate),
            repr(np.add),
            str(np.add),
            repr(np.divide),
            str(np.linalg.norm).split(" at ")[0],
            np.add == np.add,
            np.add != np.subtract,
            np.sum == np.sum,
            len({np.add, np.add, np.sum}),
        )

    def pickling() -> Any:
        objs = [np.add, np.sum, np.linalg.norm, np.fft.fft, np.sqrt]
        res = []
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            data = pickle.dumps(objs, protocol=proto)
            back = pickle.loads(data)
            res.append((data, [x is y for x, y in zip(back, objs)]))
        return res

    def copying() -> Any:
        d = {"f": np.sum, "g": [np.add]}
        deep = copy.deepcopy(d)
        return (
            copy.deepcopy(np.add) is np.add,
            copy.deepcopy(np.sum) is np.sum,
            copy.copy(np.add) is np.add,
            copy.copy(np.sum) is np.sum,
            deep["f"] is np.sum and deep["g"][0] is np.add,
        )

    def dict_keys() -> Any:
        table = {np.add: "add", np.sum: "sum", np.linalg.norm: "norm"}
        return (
            table[np.add],
            table[np.sum],
            table.get(np.linalg.norm),
            np.add in table,
            np.subtract in table,
            functools.reduce(np.add, [1, 2, 3]),
            functools.partial(np.multiply, 3)(4),
            list(map(np.sqrt, [4.0, 9.0])),
            np.vectorize(lambda x: x + 1)(a),
            np.frompyfunc(lambda x, y: x * y, 2, 1)(a, 2),
            np.apply_along_axis(np.sum, 1, m2),
        )

    def overrides() -> Any:
        u, f = c["UF"](), c["AF"]()
        return (
            np.add(u, 1),
            np.add(1, u, out=None),
            np.multiply(u, u),
            np.add.reduce(u),
            np.add.accumulate(u, axis=0),
            np.add.outer(u, 1),
            np.add.at(u, [0], 1),
            np.sum(f),
            np.sum(f, axis=0),
            np.concatenate([f, f]),
            np.mean(f),
            np.ones(2) + c["Defer"](),
        )

    for name, fn in [
        ("out", with_out),
        ("out_tuple", with_out_tuple),
        ("where", with_where),
        ("in_place", in_place),
        ("ufunc_methods", ufunc_methods),
        ("zero_d", zero_d),
        ("objects", objects),
        ("structured", structured),
        ("masked", masked),
        ("matrix", matrix),
        ("subclass", subclass),
        ("bound_on_class", bound_on_class),
        ("errors", errors),
        ("warned", warned),
        ("introspection", introspection),
        ("pickling", pickling),
        ("copying", copying),
        ("dict_keys", dict_keys),
        ("overrides", overrides),
    ]:
        case(name, fn)
    return out


def _describe(v: Any) -> str:
    import numpy as np

    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_describe(x) for x in v) + "]"
    if isinstance(v, np.ndarray):
        return f"{type(v).__name__}({v.dtype}, {v.shape}, {v.tobytes()!r}, {vars(v)!r})"
    return repr(v)
