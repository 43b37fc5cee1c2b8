"""CUDA: statistics and dumps never block the training step (computed on the device, copied to
pinned memory without blocking, resolved by the writer thread); log mode never synchronises.

The GPU tests run wherever torch sees a GPU and are skipped elsewhere. The first test runs the
same deferred path on CPU (a stand-in for the CUDA event), so the writer's resolution of lazy
values is tested on every machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import meta, ops, run_script, tensors

torch = pytest.importorskip("torch")

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_device_statistics_match_numpys_and_lazy_values_resolve_in_the_writer(
    tmp_path: Path,
) -> None:
    r = run_script(
        tmp_path,
        """
        import json
        import numpy as np
        import torch
        import pprobe
        from pprobe.interceptors import torch_values as tv
        from pprobe.interceptors.numpy_arrays import array_stats

        # 1. the device formula gives the NumPy handler's numbers
        cases = [torch.randn(100), torch.tensor([1.0, float("nan"), float("inf"), -2.0]),
                 torch.arange(10), torch.tensor([True, False, True]),
                 torch.randn(5, dtype=torch.complex64), torch.full((3,), float("nan")),
                 torch.randn(7).bfloat16(), torch.ones(0)]
        same = []
        for x in cases:
            a = tv.finish_stats(tv.device_stats(x).tolist()) if x.numel() else None
            b = tv._cpu_stats(x) if x.numel() else None
            same.append(a is None or (np.allclose(np.array(a[:4], dtype=float),
                        np.array(b[:4], dtype=float), equal_nan=True) and a[4:] == b[4:]))

        # 2. the CUDA path, with CPU memory and a stand-in event: rows hold lazy values
        class Event:
            waited = 0
            def synchronize(self):
                Event.waited += 1

        def stats(x):
            return tv._DeviceStats(tv.device_stats(x.detach()), Event())

        def dumpable(x):
            t = x.detach()
            tag = "" if t.dtype in tv.NUMPY_DTYPES else tv.dtype_name(t.dtype)
            if tag:
                t = t.view(tv._UINT[t.element_size()])
            return tv._Deferred(t.clone(), Event(), tag), None

        tv.HANDLER.stats = stats
        tv.HANDLER.dumpable = dumpable
        try:  # the native core dumps plain CPU tensors itself: here they go to the handler
            from pprobe import _native
            _native.set_dumper(None)
        except ImportError:
            pass
        a = torch.linspace(-1, 1, 5)
        b = (a * 2).bfloat16()
        pprobe.disable()
        print(json.dumps({"same": same, "waited": Event.waited}))
        """,
        env={"PPROBE_MODE": "dump"},
    ).check()
    out = json.loads(r.out.strip().splitlines()[-1])
    assert all(out["same"]), out
    # Every stand-in value waited for its event, in the writer: the 5 dumps (linspace's
    # output, mul's input and output, bfloat16's input and output) and, with the Python
    # engine, the 5 statistics too. The native core reads a CPU tensor's statistics itself
    # in C (a real CUDA tensor's go to the handler: the GPU tests below); its own dumps of
    # CPU tensors are switched off above.
    native = meta(r.run_dir)["core"]["engine"] == "native"
    assert out["waited"] >= (5 if native else 10), out
    run = r.run_dir
    assert not meta(run)["errors"], r.err
    (mul,) = ops(run, "op = 'torch.Tensor.mul'")
    outp = tensors(run, f"seq = {mul['seq']} AND role = 'output'")[0]
    assert (outp["min"], outp["max"], outp["mean"]) == (-2.0, 2.0, 0.0)
    import pprobe

    bf = ops(run, "op = 'torch.Tensor.bfloat16'")[-1]  # the last one: b
    bo = tensors(run, f"seq = {bf['seq']} AND role = 'output'")[0]
    assert bo["dump_path"].endswith(".bfloat16.npy")
    back = pprobe.load(str(run / bo["dump_path"]))
    assert back.dtype == torch.bfloat16
    assert torch.equal(back, (torch.linspace(-1, 1, 5) * 2).bfloat16())


CUDA_PROG = """
import json, sys
import torch
torch.manual_seed(0)
mode = sys.argv[1]
torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
x = torch.randn(256, 256, device="cuda")
w = torch.randn(256, 256, device="cuda", requires_grad=True)
bf = torch.randn(64, device="cuda").bfloat16()
for _ in range(3):
    y = torch.relu(x @ w)
    loss = y.square().mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.01 * w.grad
    w.grad = None
z = bf * 2
torch.cuda.set_sync_debug_mode(0)
print(json.dumps({"loss": loss.item(), "z": z.float().sum().item()}))
"""


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("mode", ["log", "stats", "dump"])
def test_cuda_never_synchronises_the_step(tmp_path: Path, mode: str) -> None:
    bare = run_script(tmp_path, CUDA_PROG, mode, probe=False).check()
    probed = run_script(
        tmp_path,
        CUDA_PROG,
        mode,
        env={"PPROBE_MODE": mode, "PPROBE_TORCH_LEVEL": "api,aten,module"},
    ).check()
    assert json.loads(bare.out.splitlines()[-1]) == json.loads(probed.out.splitlines()[-1])
    run = probed.run_dir
    assert not meta(run)["errors"], probed.err
    t = tensors(run, "device = 'cuda:0'")
    assert t
    if mode != "log":
        assert any(x["mean"] is not None for x in t)
    if mode == "dump":
        import pprobe

        (bfmul,) = ops(run, "op = 'torch.Tensor.mul' AND kind = 'method'")[-1:]
        (o,) = tensors(run, f"seq = {bfmul['seq']} AND role = 'output'")
        back = pprobe.load(str(run / o["dump_path"]))
        assert back.dtype == torch.bfloat16 and back.shape == (64,)


@pytest.mark.cuda
@needs_gpu
def test_cuda_sync_setting_times_device_work(tmp_path: Path) -> None:
    prog = """
        import torch
        a = torch.randn(2048, 2048, device="cuda")
        for _ in range(3):
            b = a @ a
        print(float(b.sum()))
    """
    r = run_script(tmp_path, prog, env={"PPROBE_MODE": "log", "PPROBE_SYNC": "1"}).check()
    mm = ops(r.run_dir, "op = 'torch.Tensor.matmul' OR op = 'torch.Tensor.__matmul__'")
    assert mm and min(m["dur_ns"] for m in mm) > 10_000  # device time, not launch time
