"""The args column of the arguments that are neither arrays nor plain scalars: classes,
dtypes, tuples of ints, objects shown by their type. Both engines write the same texts; the
native core answers the commonest ones itself (tuples of ints, texts it learnt for the same
object or type) and forgets what it learnt when ``pprobe.values`` registers a type."""

from __future__ import annotations

from helpers import ops, run_script

SCRIPT = """
import numpy as np
from pprobe import values

x = np.ones(64)


for _ in range(3):                                  # the second and third answered from cache
    x.astype(np.float64)                            # a static class
    x.astype(np.dtype("float32"))                   # a builtin dtype
    x.astype(np.dtype([("a", "<i4")]))              # a structured dtype (not a singleton)
    np.broadcast_to(x, (64,))                       # small ints: packed
    np.broadcast_to(x, (1024, 64)[1:])              # the same, built at run time
    np.full((1000, 2000), 0.5, dtype=np.float32)[:0]  # no small int: the tuple itself
    np.reshape(np.ones(1), ())                      # an empty tuple
    np.array(x, copy=np._CopyMode.IF_NEEDED)        # an enum shown by its type
    np.asarray(x, like=None)
    np.sum(x, axis=(0,), keepdims=False)
    np.full((2 ** 70 // 2 ** 68,), 1.0)             # an int computed: (4,)
    np.isin(x, x, kind=None)

"""

WANT = [
    ("numpy.ndarray.astype", "1=<class 'numpy.float64'>"),
    ("numpy.ndarray.astype", "1=dtype('float32')"),
    ("numpy.ndarray.astype", "1=dtype([('a', '<i4')])"),
    ("numpy.broadcast_to", "1=(64,)"),
    ("numpy.full", "0=(1000, 2000), 1=0.5, dtype=<class 'numpy.float32'>"),
    ("numpy.reshape", "1=()"),
    ("numpy.array", "copy=<numpy._CopyMode>"),
    ("numpy.asarray", "like=None"),
    ("numpy.sum", "axis=(0,), keepdims=False"),
    ("numpy.full", "0=(4,), 1=1.0"),
    ("numpy.isin", "kind=None"),
]


def test_texts_of_classes_dtypes_tuples_and_opaque_objects(tmp_path):
    r = run_script(tmp_path, SCRIPT, env={"PPROBE_MODE": "log"}).check()
    rows = [(x["op"], x["args"]) for x in ops(r.run_dir)]
    for want in WANT:
        # every one of the three rounds says the same
        assert rows.count(want) >= 3, (want, sorted(set(rows)))
    assert rows.count(("numpy.broadcast_to", "1=(64,)")) == 6  # (64,) both ways


OPAQUE = """
import numpy as np
from pprobe import values


class Thing:
    pass


t = Thing()
for _ in range(3):
    np.atleast_1d(t)                    # shown by its type: <__main__.Thing>
values.register_text(Thing, lambda v: "a thing")
for _ in range(2):
    np.atleast_1d(t)                    # the registration wins over what was learnt
"""


def test_a_registration_changes_what_was_learnt_for_a_type(tmp_path):
    r = run_script(tmp_path, OPAQUE, env={"PPROBE_MODE": "log"}).check()
    args = [x["args"] for x in ops(r.run_dir) if x["op"] == "numpy.atleast_1d"]
    assert args == ["0=<__main__.Thing>"] * 3 + ["0=a thing"] * 2, args


EQUAL_VALUES = """
import numpy as np

for _ in range(3):
    np.full(2, 1)
    np.full(2, 1.0)
    np.full(2, True)
    np.full(2, 0.0)
    np.full(2, -0.0)
    np.full(2, float("nan"))
    np.full(2, 10**30)
    np.full(2, "1")
    np.sum(np.ones(3), axis=0, keepdims=True)
    np.sum(np.ones(3), axis=0, keepdims=1)
"""


def test_rows_with_equal_args_of_other_types_keep_their_own_texts(tmp_path):
    """The native core shares one args tuple between rows whose args are equal in every type
    and bit (fewer objects held for the writer); values that Python calls equal but that
    print differently (1, 1.0, True; 0.0 and -0.0) keep their own texts, in both engines."""
    want = ["0=2, 1=1", "0=2, 1=1.0", "0=2, 1=True", "0=2, 1=0.0", "0=2, 1=-0.0", "0=2, 1=nan",
            "0=2, 1=1000000000000000000000000000000", "0=2, 1='1'",
            "axis=0, keepdims=True", "axis=0, keepdims=1"]  # fmt: skip
    for engine in ("native", "python"):
        r = run_script(tmp_path / engine, EQUAL_VALUES,
                       env={"PPROBE_MODE": "log", "PPROBE_CORE": engine}).check()  # fmt: skip
        got = [x["args"] for x in ops(r.run_dir, "op IN ('numpy.full', 'numpy.sum')")]
        assert got == want * 3, (engine, got)


YOUNG_COUNT = """
import gc, json, sys
import numpy as np

a, b = np.ones((8, 8)), np.ones(8)
for _ in range(200):
    np.broadcast_to(b, (8,)); a.astype(np.float32, copy=False); np.sum(a, axis=0)
gc.collect()
before = gc.get_count()[0], gc.get_stats()[0]["collections"]
for _ in range(3000):
    np.broadcast_to(b, (8,)); a.astype(np.float32, copy=False); np.sum(a, axis=0)
after = gc.get_count()[0], gc.get_stats()[0]["collections"]
grown = after[0] - before[0] + (after[1] - before[1]) * gc.get_threshold()[0]
print(json.dumps({"per_call": grown / 9000}))
"""


def test_recorded_args_do_not_feed_the_young_generation(tmp_path):
    """A row's args wait for the writer's flush. Made anew for every call, they raised the
    collector's count of young objects by ~3 a call in a loop that allocates nothing itself,
    so young collections ran only because of the probe (and then a full one, ~30-50 ms, in the
    SciPy loop). Rows with the same args share one tuple now: the count stays as unprobed.
    (No flush in the window: PPROBE_FLUSH_SECONDS and the 16,384 rows of a flush are far.)"""
    import json

    r = run_script(tmp_path, YOUNG_COUNT,
                   env={"PPROBE_MODE": "log", "PPROBE_CORE": "native",
                        "PPROBE_FLUSH_SECONDS": "600"}).check()  # fmt: skip
    per_call = json.loads(r.out.strip().splitlines()[-1])["per_call"]
    assert per_call < 0.5, per_call
    assert len(ops(r.run_dir, "op = 'numpy.broadcast_to'")) == 3200
