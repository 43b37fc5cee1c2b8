"""Dump codecs on the NumPy MLP's dumps (docs/codecs.md): bytes on disk, encode and decode
MB/s, the max error of the lossy ones, and what each costs the probed program end to end.

python -m bench.codecs [--steps 30] [--rounds 3] [--no-e2e] [--format json]

1. examples/numpy_mlp.py runs once under the probe (default codec, npy): its distinct dumps
   (one per inode) are the corpus.
2. Every codec encodes and decodes the whole corpus in this process, ``--rounds`` times; the
   figure is the best round (MB/s of raw array bytes, one thread). The same for one 16 MB
   float32 array (a ReLU output: half zeros), where per-call costs vanish.
3. End to end (unless ``--no-e2e``): the MLP runs under the probe with each codec, rounds
   interleaved; the median wall time of the program (start to exit, dumps written) and the
   dump bytes on disk of its run. npy runs twice: with the native engines, and with
   PPROBE_CORE=python (the Python recording engine and dump writer, as a reference for the
   Python writer thread that the other codecs use beside the native recording engine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CODECS = ("npy", "zstd", "sparse", "int8", "fp16", "bf16")


def _probe_env(out: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPROBE") and k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(REPO / "bootstrap"), PPROBE_OUTPUT=str(out), **extra)
    return env


def _run_mlp(out: Path, steps: int, **env: str) -> float:
    mlp = str(REPO / "examples" / "numpy_mlp.py")
    code = f"import runpy; runpy.run_path({mlp!r})['main']({steps})"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=_probe_env(out, **env), check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - t0


def _dump_files(run_dir: Path) -> list[Path]:
    seen: set[int] = set()
    out = []
    for p in sorted(run_dir.iterdir()):
        if ".npy" in p.name and not p.name.startswith(".") and p.is_file():
            ino = p.stat().st_ino
            if ino not in seen:
                seen.add(ino)
                out.append(p)
    return out


def _disk_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in _dump_files(run_dir))


def in_process(arrays: list[Any], rounds: int) -> list[dict[str, Any]]:
    from pprobe import codecs

    raw = sum(int(a.nbytes) for a in arrays)
    rows = []
    for name in CODECS:
        enc_s = dec_s = float("inf")
        blobs: list[bytes] = []
        infos: list[dict[str, Any]] = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            got = [codecs.encode(name, a) for a in arrays]
            enc_s = min(enc_s, time.perf_counter() - t0)
            blobs = [g[0] for g in got]
            infos = [g[1] for g in got]
            t0 = time.perf_counter()
            for b in blobs:
                codecs.decode(b)
            dec_s = min(dec_s, time.perf_counter() - t0)
        used: dict[str, int] = {}
        for i in infos:
            used[i["codec"]] = used.get(i["codec"], 0) + 1
        rows.append({
            "codec": name,
            "bytes": sum(len(b) for b in blobs),
            "ratio": raw / max(1, sum(len(b) for b in blobs)),
            "encode_MBps": raw / enc_s / 1e6,
            "decode_MBps": raw / dec_s / 1e6,
            "max_abs_error": max((i["max_abs_error"] for i in infos), default=0.0),
            "stored_as": used,
        })  # fmt: skip
    return rows


def end_to_end(steps: int, rounds: int, tmp: Path) -> list[dict[str, Any]]:
    variants = [
        ("npy (native writer)", {"PPROBE_DUMP_CODEC": "npy"}),
        ("npy (PPROBE_CORE=python)", {"PPROBE_DUMP_CODEC": "npy", "PPROBE_CORE": "python"}),
    ]
    variants += [(c, {"PPROBE_DUMP_CODEC": c}) for c in CODECS[1:]]  # fmt: skip
    times: dict[str, list[float]] = {v: [] for v, _ in variants}
    disk: dict[str, int] = {}
    writer: dict[str, str] = {}
    for r in range(rounds):
        for name, env in variants:
            out = tmp / f"e2e-{r}-{name.replace(' ', '_').strip('()')}"
            times[name].append(_run_mlp(out, steps, **env))
            run_dir = (out / "latest").resolve()
            disk[name] = _disk_bytes(run_dir)
            m = json.loads((run_dir / "meta.json").read_text())
            writer[name] = m["dumps"].get("writer", "?")
    return [
        {
            "variant": v,
            "wall_s": statistics.median(times[v]),
            "disk_bytes": disk[v],
            "dump_writer": writer[v],
        }  # fmt: skip
        for v, _ in variants
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.codecs", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-e2e", action="store_true")
    p.add_argument("--format", choices=("text", "json"), default="text")
    a = p.parse_args(argv)
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="pprobe-bench-codecs-") as d:
        tmp = Path(d)
        _run_mlp(tmp / "corpus", a.steps)
        files = _dump_files((tmp / "corpus" / "latest").resolve())
        arrays = [np.load(f) for f in files]
        raw = sum(int(x.nbytes) for x in arrays)
        # one large array too: per-call costs (header, small buffers) vanish
        big = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)
        np.maximum(big, 0, out=big)  # ReLU-like: half zeros, as activations are
        res: dict[str, Any] = {
            "corpus": {"files": len(files), "raw_bytes": raw, "steps": a.steps},
            "in_process": in_process(arrays, a.rounds),
            "large": in_process([big], a.rounds),
        }
        if not a.no_e2e:
            res["end_to_end"] = end_to_end(a.steps, a.rounds, tmp)
    if a.format == "json":
        print(json.dumps(res, indent=2))
        return 0
    c = res["corpus"]
    mb = c["raw_bytes"] / 1e6
    print(f"numpy MLP, {c['steps']} steps: {c['files']} distinct dumps, {mb:.2f} MB of array "
          f"bytes; best of {a.rounds} rounds, one thread")  # fmt: skip
    print(f"{'codec':8} {'bytes':>10} {'ratio':>6} {'enc MB/s':>9} {'dec MB/s':>9} "
          f"{'max abs err':>12}  stored as")  # fmt: skip
    for r in res["in_process"]:
        used = ", ".join(f"{k} {n}" for k, n in sorted(r["stored_as"].items()))
        print(f"{r['codec']:8} {r['bytes']:>10} {r['ratio']:>6.2f} {r['encode_MBps']:>9.0f} "
              f"{r['decode_MBps']:>9.0f} {r['max_abs_error']:>12.3g}  {used}")  # fmt: skip
    print("\none 16 MB float32 array (ReLU of N(0, 1): half zeros):")
    for r in res["large"]:
        used = ", ".join(f"{k} {n}" for k, n in sorted(r["stored_as"].items()))
        print(f"{r['codec']:8} {r['bytes']:>10} {r['ratio']:>6.2f} {r['encode_MBps']:>9.0f} "
              f"{r['decode_MBps']:>9.0f} {r['max_abs_error']:>12.3g}  {used}")  # fmt: skip
    if "end_to_end" in res:
        print(f"\nend to end (median of {a.rounds} rounds; program wall time, dumps on disk):")
        for r in res["end_to_end"]:
            print(f"{r['variant']:25} {r['wall_s']:>7.2f} s {r['disk_bytes']:>10} bytes  "
                  f"dump writer: {r['dump_writer']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
