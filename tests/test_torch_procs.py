"""The torch probe across processes: DataLoader workers under fork, spawn and forkserver, and
torchrun with two ranks on gloo (one shard per rank in one run folder, ranks in every row,
collectives as rows)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import PYTHON, meta, ops, run, run_script, shard_pids, write

torch = pytest.importorskip("torch")


def test_dataloader_workers_fork_spawn_forkserver(tmp_path: Path) -> None:
    r = run_script(
        tmp_path,
        """
        import json, os, sys
        import torch
        from torch.utils.data import DataLoader, Dataset


        class Squares(Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return torch.full((2,), float(i)) ** 2


        if __name__ == "__main__":
            out = {}
            for method in ("fork", "spawn", "forkserver"):
                dl = DataLoader(Squares(), batch_size=4, num_workers=2,
                                multiprocessing_context=method)
                out[method] = sum(float(b.sum()) for b in dl)
            print(json.dumps(out))
        """,
        env={"PPROBE_MODE": "stats"},
        timeout=240,
    ).check()
    assert r.out.strip().endswith('{"fork": 280.0, "spawn": 280.0, "forkserver": 280.0}')
    run = r.run_dir
    main_pid = meta(run)["pid"]
    workers = {x["pid"] for x in ops(run, "op = 'torch.full'") if x["pid"] != main_pid}
    # two workers per DataLoader, each in its own process and shard
    assert len(workers) == 6, workers
    assert workers <= shard_pids(run)
    pows = ops(run, "op = 'torch.Tensor.__pow__' OR op = 'torch.Tensor.pow'")
    assert {p["pid"] for p in pows} == workers
    stacks = ops(run, "op = 'torch.stack'")  # default_collate, in the workers
    assert {s["pid"] for s in stacks} == workers
    assert not meta(run)["errors"], r.err


@pytest.mark.skipif(
    not (hasattr(torch, "distributed") and torch.distributed.is_available()),
    reason="torch.distributed is not available",
)
def test_torchrun_two_ranks_gloo_one_run_folder(tmp_path: Path) -> None:
    script = write(
        tmp_path / "ddp.py",
        """
        import torch
        import torch.distributed as dist
        import torch.nn as nn

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        t = torch.ones(2) * (rank + 1)
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
        with open(f"result-{rank}.txt", "w") as f:  # ranks' stdout lines interleave
            f.write(repr(t.tolist()))
        dist.destroy_process_group()
        """,
    )
    port = 29500 + os.getpid() % 1000
    r = run(
        [
            PYTHON,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            str(script),
        ],
        tmp_path,
        env={"PPROBE_MODE": "log", "OMP_NUM_THREADS": "1"},
        timeout=240,
    ).check()
    for rank in (0, 1):
        assert (tmp_path / f"result-{rank}.txt").read_text() == "[3.0, 3.0]"
    assert len(r.runs) == 1  # the launcher and both ranks share one run folder
    run_dir = r.run_dir
    rows = ops(run_dir)
    ranks = {(x["rank"], x["world_size"]) for x in rows}
    assert ranks == {(0, 2), (1, 2)}
    by_rank = {}
    for x in rows:
        by_rank.setdefault(x["rank"], set()).add(x["pid"])
    assert all(len(p) == 1 for p in by_rank.values())  # one process (shard) per rank
    assert {p for ps in by_rank.values() for p in ps} <= shard_pids(run_dir)
    coll = ops(run_dir, "kind = 'collective'")
    assert sorted((c["rank"], c["op"]) for c in coll) == [
        (0, "torch.distributed.all_reduce"),
        (0, "torch.distributed.broadcast"),
        (1, "torch.distributed.all_reduce"),
        (1, "torch.distributed.broadcast"),
    ]
    # DDP training: both ranks count their optimizer steps
    assert {x["step"] for x in rows} == {0, 1, 2}
    procs = list((run_dir / "procs").glob("*.json"))
    assert len(procs) >= 3  # the launcher, rank 0, rank 1
