"""The pack writer's CRC-32 (pprobe/_dumpio.c): bytes per second of each implementation.

python -m bench.crc_cost [--rounds 7] [--sizes 1024,65536,1048576] [--target-s 0.05] [--json F]

In this process, through ``_dumpio.crc32(data, value, portable)``: ``tables`` (slicing by 8,
``portable=True``), ``dispatch`` (what the writer runs: carry-less multiplication folding
where ``_dumpio.CRC_CLMUL`` is 1, else the tables) and, for reference, ``zlib.crc32``. Each
call chains the previous value, as the writer chains head, name and payload. The variants
are interleaved round by round and each figure is the median over the rounds of one batch of
calls (about ``--target-s`` seconds each). The Python call's own cost (the same call on an
empty buffer, about 0.1 us) is measured alongside and subtracted: "net GB/s" is the CRC's
speed, "raw GB/s" that of the whole call. The ratio is dispatch / tables on the net figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

from .harness import median

Fn = Callable[[Any, int], int]


def _variants(dumpio: Any) -> dict[str, Fn]:
    crc = dumpio.crc32
    return {
        "tables": lambda d, v: crc(d, v, True),
        "dispatch": lambda d, v: crc(d, v, False),
        "zlib": zlib.crc32,
    }


def _batch(fn: Fn, data: Any, calls: int) -> float:
    """Seconds per call over one batch of chained calls."""
    v = 0
    t0 = time.perf_counter()
    for _ in range(calls):
        v = fn(data, v)
    return (time.perf_counter() - t0) / calls


def measure(sizes: list[int], rounds: int, target_s: float) -> dict[str, Any]:
    from pprobe import _dumpio as dumpio

    variants = _variants(dumpio)
    rng = random.Random(0)
    out: dict[str, Any] = {"crc_clmul": dumpio.CRC_CLMUL, "load_before": os.getloadavg()}
    empty = b""
    for size in sizes:
        data = rng.randbytes(size)
        calls: dict[str, int] = {}
        for name, fn in variants.items():  # calibration: batches of about target_s
            per = _batch(fn, data, 20)
            calls[name] = max(20, int(target_s / max(per, 1e-9)))
        n_empty = max(calls.values())
        times: dict[str, list[float]] = {name: [] for name in variants}
        overhead: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, fn in variants.items():
                times[name].append(_batch(fn, data, calls[name]))
                overhead[name].append(_batch(fn, empty, min(n_empty, 200_000)))
        row: dict[str, Any] = {}
        for name in variants:
            t = median(times[name])
            o = median(overhead[name])
            row[name] = {
                "s_per_call": t,
                "call_overhead_s": o,
                "raw_gbps": size / t / 1e9,
                "net_gbps": size / max(t - o, 1e-12) / 1e9,
            }
        row["ratio_net"] = row["dispatch"]["net_gbps"] / row["tables"]["net_gbps"]
        out[str(size)] = row
    out["load_after"] = os.getloadavg()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.crc_cost", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--sizes", default="1024,65536,1048576")
    p.add_argument("--target-s", type=float, default=0.05)
    p.add_argument("--json", help="write the figures there")
    a = p.parse_args(argv)
    from pprobe import core

    if core.dumpio() is None:
        print("no native pprobe._dumpio (PPROBE_CORE=python or not built)")
        return 1
    sizes = [int(s) for s in a.sizes.split(",")]
    out = measure(sizes, a.rounds, a.target_s)
    la = out["load_before"]
    print(f"## CRC-32, {a.rounds} rounds; folding (CRC_CLMUL) = {out['crc_clmul']}; "
          f"load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")  # fmt: skip
    print(f"{'bytes':>9} {'variant':>9} {'us/call':>9} {'raw GB/s':>9} {'net GB/s':>9}")
    for size in sizes:
        row = out[str(size)]
        for name in ("tables", "dispatch", "zlib"):
            r = row[name]
            print(f"{size:>9} {name:>9} {r['s_per_call'] * 1e6:>9.3f} "
                  f"{r['raw_gbps']:>9.2f} {r['net_gbps']:>9.2f}")  # fmt: skip
        print(f"{size:>9} {'ratio':>9} dispatch / tables (net): {row['ratio_net']:.2f}x")
    print(f"load average after: {out['load_after'][0]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
