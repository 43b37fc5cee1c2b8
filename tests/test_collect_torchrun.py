"""End to end: a 2-rank torchrun (gloo) on localhost streams to a collector in a subprocess;
the collected run is queried while the ranks run and after, against the local copy."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from collect_helpers import Collector, run_folders, token_file, wait_for
from helpers import BOOTSTRAP, PYTHON, clean_env, meta, sql, write

torch = pytest.importorskip("torch")

DDP = """
import time
import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(40):
    opt.zero_grad()
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    time.sleep(0.05)
t = torch.ones(2) * (rank + 1)
dist.all_reduce(t)
with open(f"result-{rank}.txt", "w") as f:
    f.write(repr(t.tolist()))
dist.destroy_process_group()
"""


def _ranks(run_dir: Path) -> dict[int, int]:
    try:
        rows = sql(
            run_dir, "SELECT rank, count(*) AS n FROM ops WHERE rank IS NOT NULL GROUP BY rank"
        )
    except Exception:
        return {}
    return {r["rank"]: r["n"] for r in rows}


@pytest.mark.skipif(
    not (hasattr(torch, "distributed") and torch.distributed.is_available()),
    reason="torch.distributed is not available",
)
def test_torchrun_two_ranks_stream_to_one_collector(tmp_path: Path) -> None:
    c = Collector(tmp_path, tmp_path / "collected", token_file(tmp_path)).start()
    script = write(tmp_path / "ddp.py", DDP)
    port = 29500 + (os.getpid() + 7) % 1000
    env = clean_env(PPROBE_OUTPUT=str(tmp_path / "out"), PYTHONPATH=str(BOOTSTRAP),
                    PPROBE_MODE="log", PPROBE_FLUSH_SECONDS="0.1", OMP_NUM_THREADS="1",
                    **c.client_env())  # fmt: skip
    p = subprocess.Popen(
        [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
         f"--master_port={port}", str(script)],
        cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # queried while the ranks run: both ranks' rows are there before the job ends
        wait_for(lambda: run_folders(c.output) and len(_ranks(run_folders(c.output)[0])) == 2,
                 timeout=180)  # fmt: skip
        running = p.poll() is None
        _out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    finally:
        if p.poll() is None:
            p.kill()
        c.stop()
    assert running  # the query above ran while the job did
    for rank in (0, 1):
        assert (tmp_path / f"result-{rank}.txt").read_text() == "[3.0, 3.0]"
    local = (tmp_path / "out" / "latest").resolve()
    runs = run_folders(c.output)
    assert [r.name for r in runs] == [local.name]  # the launcher and both ranks: one run
    got = runs[0]
    q = "SELECT pid, seq, rank, world_size, op, step FROM ops ORDER BY pid, seq"
    want = sql(local, q)
    assert sql(got, q) == want and len(want) > 100
    assert {r["rank"] for r in want if r["rank"] is not None} == {0, 1}
    assert set(_ranks(got)) == {0, 1}
    # one shard per rank's process, named by host and pid
    pids = {r["pid"] for r in want}
    shards = {int(p.stem.rsplit("-", 1)[1]) for p in (got / "log").glob("ops-*.arrows")}
    assert pids <= shards
    m = meta(got)
    assert m["ranks"] == [0, 1] and m["exit"]["status"] == "ok"
    procs = [p for p in (got / "procs").glob("*.json")]
    assert len(procs) >= 2
