"""The native dump writer's CPU per MB appended to a pack (pprobe/_dumpio.c), this tree against
another (issue #10).

python -m bench.pack_writer_cost [--base DIR] [--rounds 5] [--entries 4000] [--kb 128]
                                 [--dir DIR] [--json F]

Each round runs one child per tree, in alternating order (drift cancels within a round): the
child opens the native queue on a new folder under ``--dir`` (default: the system's temporary
folder; put it on the disk the runs go to), submits ``--entries`` pack entries of ``--kb`` KiB
of float32 values, closes the queue (it waits until they are written) and reports the
writer thread's CPU: the process's CPU clock minus the main thread's, per MB appended. The
figure is the median over the rounds, and the ratio this / base. ``--base``: a checkout
whose ``pprobe`` package has its native modules built in place (``python setup.py build_ext
--inplace``). The first round of a fresh machine writes into page-cache pages the kernel has
not handed out before, which costs more on the development VMs than pages just freed: read
the rounds, not only the median.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from .harness import median

_CHILD = r"""
import json, os, shutil, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from pprobe import core, dumps
mod = core.dumpio()
if mod is None or not dumps.__file__.startswith(sys.argv[1]):
    print(json.dumps({"error": "no native writer in " + sys.argv[1]}))
    raise SystemExit
n, kb = int(sys.argv[2]), int(sys.argv[3])
q = dumps.NativeQueue(mod)
a = np.random.default_rng(0).standard_normal(kb * 256).astype(np.float32)
h = dumps.npy_header(a.dtype, a.shape)
d = tempfile.mkdtemp(prefix="pprobe-packw-", dir=sys.argv[4])
fd = os.open(d, os.O_RDONLY)
try:
    q.set_host("bench")
    q.open(fd, 64 << 20)
    p0, t0 = time.process_time(), time.thread_time()
    for i in range(n):
        q.submit(f"x{i}.npy", h, a, None, True, True)
    ok = q.close(120.0)
    writer = (time.process_time() - p0) - (time.thread_time() - t0)
finally:
    os.close(fd)
    shutil.rmtree(d)
mb = n * (a.nbytes + len(h)) / 1e6
print(json.dumps({"ok": ok, "ms_per_mb": writer / mb * 1e3, "mb": mb}))
"""


def _child(tree: str, entries: int, kb: int, folder: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", _CHILD, tree, str(entries), str(kb), folder],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    lines = r.stdout.strip().splitlines()
    if r.returncode or not lines:
        return {"error": (r.stderr or r.stdout)[-500:]}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pack_writer_cost",
                                description=(__doc__ or "").split("\n")[0])  # fmt: skip
    p.add_argument("--base", help="another checkout, its native modules built in place")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--entries", type=int, default=4000)
    p.add_argument("--kb", type=int, default=128, help="KiB per entry")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the packs are written")
    p.add_argument("--json", help="write the figures there")
    a = p.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"this": here}
    if a.base:
        trees["base"] = os.path.abspath(a.base)
    got: dict[str, list[float]] = {k: [] for k in trees}
    for r in range(a.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for k in order:
            o = _child(trees[k], a.entries, a.kb, a.dir)
            if "error" in o or not o.get("ok"):
                print(f"{k} ({trees[k]}): {o.get('error', 'the queue did not drain')}")
                return 1
            got[k].append(o["ms_per_mb"])
    print(f"native pack writer, {a.entries} entries of {a.kb} KiB per child, {a.rounds} rounds, "
          f"packs under {a.dir}; writer thread CPU, ms per MB appended:")  # fmt: skip
    out: dict[str, Any] = {"trees": trees, "rounds": got}
    for k, v in got.items():
        out[k] = median(v)
        print(f"  {k:5} {median(v):.3f}  (rounds: {' '.join(f'{x:.3f}' for x in v)})")
    if "base" in got:
        out["ratio"] = median(got["this"]) / median(got["base"])
        print(f"  this / base: x{out['ratio']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
