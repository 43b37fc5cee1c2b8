"""What streaming to a collector costs: transport throughput and the CPU the client adds.

python -m bench.collect [--batches 60] [--clients 8] [--rounds 5] [--ops 200000]

1. Throughput. A collector (``pprobe collect``) runs in a subprocess on loopback. Each client
   process builds a real ops batch of 16,384 rows (from a probed NumPy run's shard), then
   hands ``--batches`` copies to a :class:`pprobe.collect.client.Forwarder`, exactly as the
   log writer does, and waits until every batch is acknowledged. rows/s and MB/s (Arrow bytes)
   per client, for one client alone and for ``--clients`` clients at once.
2. Client CPU. A probed NumPy loop (``--ops`` small ops, log mode) runs with and without
   ``PPROBE_COLLECTOR``, interleaved ``--rounds`` times: the main thread's CPU time (what the
   program's own threads pay) and the whole process's CPU time (rusage: every thread, the
   sender included). Ratios are medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BOOT = REPO / "bootstrap"
ROWS = 16384

WORKLOAD = """
import json, sys, time
import numpy as np
n = int(sys.argv[1])
a = np.ones(16)
t0, c0 = time.perf_counter(), time.thread_time()
for _ in range(n // 2):
    a = np.add(a, 1.0)
    a = np.multiply(a, 0.5)
print(json.dumps({"main_cpu": time.thread_time() - c0, "wall": time.perf_counter() - t0}))
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPROBE")
           and k not in ("PYTHONPATH", "RANK", "WORLD_SIZE")}  # fmt: skip
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def _sample(tmp: Path) -> Path:
    """A 16,384-row ops batch from a real probed run, saved as an Arrow IPC file."""
    import pyarrow as pa

    (tmp / "w.py").write_text(WORKLOAD)
    env = _env(PYTHONPATH=str(BOOT), PPROBE_MODE="log", PPROBE_OUTPUT=str(tmp / "sample"))
    subprocess.run([sys.executable, str(tmp / "w.py"), "4000"], env=env, check=True,
                   capture_output=True, cwd=tmp)  # fmt: skip
    from pprobe.query import read_shard

    shard = next((tmp / "sample").glob("*/log/ops-*.arrows"))
    batches, _ = read_shard(str(shard))
    t = pa.Table.from_batches(batches)
    reps = -(-ROWS // t.num_rows)
    t = pa.concat_tables([t] * reps).slice(0, ROWS).combine_chunks()
    out = tmp / "sample.arrow"
    with pa.ipc.new_file(str(out), t.schema) as w:
        w.write_table(t)
    return out


def _collector(tmp: Path) -> tuple[subprocess.Popen[str], str, Path]:
    tok = tmp / "token"
    tok.write_text(secrets.token_urlsafe(24))
    tok.chmod(0o600)
    p = subprocess.Popen(
        [sys.executable, "-m", "pprobe", "collect", "--listen", "127.0.0.1:0", "--output",
         str(tmp / "collected"), "--token-file", str(tok)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env(),
    )  # fmt: skip
    assert p.stdout is not None
    line = p.stdout.readline()
    url = line.split("listening on ")[1].split(",")[0]
    return p, url, tok


def worker(sample: str, url: str, token: str, batches: int) -> None:
    """One client: ``batches`` batches through a Forwarder; prints rows, bytes, seconds."""
    import pyarrow as pa

    from pprobe.collect.client import Forwarder
    from pprobe.config import Config

    batch = pa.ipc.open_file(sample).get_batch(0)
    run_dir = tempfile.mkdtemp(prefix="bench-collect-")
    cfg = Config(collector=url, collector_token_file=token, collector_drain_seconds=600.0)
    f = Forwarder(cfg, "bench", run_dir, f"client{os.getpid()}")
    f.start()
    t0 = time.perf_counter()
    for _ in range(batches):
        f.submit("ops", batch)
    s = f.close()
    dt = time.perf_counter() - t0
    assert s["rows_sent"] == batches * batch.num_rows, s
    print(json.dumps({"rows": s["rows_sent"], "bytes": s["bytes_sent"], "s": dt}))


def _clients(n: int, sample: Path, url: str, tok: Path, batches: int) -> list[dict[str, float]]:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.collect",
                "--worker",
                str(sample),
                url,
                str(tok),
                str(batches),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=_env(),
            cwd=REPO,
        )  # fmt: skip
        for _ in range(n)
    ]
    out = []
    for p in procs:
        o, _ = p.communicate(timeout=600)
        assert p.returncode == 0
        out.append(json.loads(o))
    return out


def _cpu_run(tmp: Path, ops: int, env: dict[str, str]) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, str(tmp / "w.py"), str(ops)], env=env, check=True,
                       capture_output=True, text=True, cwd=tmp)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    d = json.loads(p.stdout)
    d["proc_cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return d


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.collect", description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=200000)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        sample = _sample(tmp)
        coll, url, tok = _collector(tmp)
        try:
            print(f"cores: {os.cpu_count()}; batch: {ROWS} ops rows, "
                  f"{sample.stat().st_size / 1e6:.2f} MB as an IPC file")  # fmt: skip
            for n in (1, a.clients):
                res = _clients(n, sample, url, tok, a.batches)
                rps = [r["rows"] / r["s"] for r in res]
                mbs = [r["bytes"] / r["s"] / 1e6 for r in res]
                wall = max(r["s"] for r in res)
                total = sum(r["rows"] for r in res)
                print(f"{n} client(s): per client median {statistics.median(rps):,.0f} rows/s, "
                      f"{statistics.median(mbs):.1f} MB/s; all together {total / wall:,.0f} "
                      f"rows/s, {sum(r['bytes'] for r in res) / wall / 1e6:.1f} MB/s")  # fmt: skip
            base = _env(PYTHONPATH=str(BOOT), PPROBE_MODE="log", PPROBE_OUTPUT=str(tmp / "o"),
                        PPROBE_SUMMARY_LINE="off")  # fmt: skip
            with_c = dict(base, PPROBE_COLLECTOR=url, PPROBE_COLLECTOR_TOKEN_FILE=str(tok))
            rows: dict[str, list[dict[str, float]]] = {"local": [], "collector": []}
            for _ in range(a.rounds):
                rows["local"].append(_cpu_run(tmp, a.ops, base))
                rows["collector"].append(_cpu_run(tmp, a.ops, with_c))
            med = {k: {f: statistics.median(r[f] for r in v) for f in ("main_cpu", "proc_cpu")}
                   for k, v in rows.items()}  # fmt: skip
            ratio_main = [c["main_cpu"] / b["main_cpu"] for b, c in
                          zip(rows["local"], rows["collector"])]  # fmt: skip
            ratio_proc = [c["proc_cpu"] / b["proc_cpu"] for b, c in
                          zip(rows["local"], rows["collector"])]  # fmt: skip
            print(f"client CPU, {a.ops} NumPy ops in log mode, {a.rounds} rounds (medians):")
            for k in ("local", "collector"):
                print(f"  {k:9}  main thread {med[k]['main_cpu']:.3f} s, "
                      f"process {med[k]['proc_cpu']:.3f} s")  # fmt: skip
            extra = med["collector"]["proc_cpu"] - med["local"]["proc_cpu"]
            print(f"  collector/local: main thread x{statistics.median(ratio_main):.3f}, "
                  f"process x{statistics.median(ratio_proc):.3f} ({extra:+.3f} s, "
                  f"{extra / a.ops * 1e9:+.0f} ns per op row)")  # fmt: skip
        finally:
            coll.terminate()
            coll.wait(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
