"""Timing and floor measurements shared by the benchmarks (benchmarks/bench_*.py).

Every bench reports its speed against floors measured in the same run on the same GPU: copy
bandwidth (read + write of 1 GiB) and a dense matmul rate. On an H100 the matmul rate is a wgmma
rate, which no kernel of the mma.sync class (SM120's only tensor-core path) can reach; mma_sync_flops()
measures that class's own ceiling (benchmarks/mma_peak.cu).
"""
import json
import os
import shutil
import subprocess
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timeit(fn, iters=20, warmup=3):
    """Median eager time of one call in µs (CUDA events)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def capture_graph(fn, reps=10):
    """One warm-up call, then `reps` calls of `fn` captured in a CUDA graph (replayed once)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    return g


def kernel_times(fn, reps=5, iters=3):
    """Median device time per kernel name (torch profiler over replays of a graph of `reps` calls
    of `fn`). With PDL a kernel's span includes its early residency (waiting for the previous one)."""
    from torch.profiler import ProfilerActivity, profile
    g = capture_graph(fn, reps)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            g.replay()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per.setdefault(e.name.split("(")[0][:60], []).append(e.time_range.elapsed_us())
    return {k: sorted(v)[len(v) // 2] for k, v in per.items()}


def timeit_graph(fn, reps=10, iters=10):
    """Per-call time in µs with `reps` calls captured in one CUDA graph (as SGLang decode runs): no
    host overhead in the number. Returns (µs, True), or eager timing and False if capture fails."""
    fn()   # an error of fn itself surfaces here, not as a failed capture
    torch.cuda.synchronize()
    try:
        g = capture_graph(fn, reps)
    except Exception as e:  # noqa: BLE001
        print("graph capture failed, eager timing:", str(e)[:160])
        return timeit(fn), False
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / reps)
    ts.sort()
    del g
    return ts[len(ts) // 2], True


def copy_bw():
    """Bytes/s of a 1 GiB device-to-device copy, read + write counted."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    us = timeit(lambda: y.copy_(x), iters=10)
    del x, y
    return 2 * (1 << 30) / (us * 1e-6)


def bf16_flops(n=8192):
    """FLOP/s of a dense bf16 n x n x n matmul."""
    a = torch.randn(n, n, device="cuda").bfloat16()
    b = torch.randn(n, n, device="cuda").bfloat16()
    us = timeit(lambda: torch.mm(a, b), iters=10)
    return 2 * n ** 3 / (us * 1e-6)


def fp8_flops(n=8192):
    """FLOP/s of a dense e4m3 n x n x n scaled matmul (None where torch has no fp8 GEMM here)."""
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    try:
        us = timeit(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), iters=10)
        return 2 * n ** 3 / (us * 1e-6)
    except Exception as e:  # noqa: BLE001
        print("scaled_mm failed:", e)
        return None


def mma_sync_flops():
    """FLOP/s of mma.sync m16n8k16 bf16 (fp32 accumulate) with register operands on this GPU: the best of
    1..4 warps per scheduler in benchmarks/mma_peak.cu, built here with nvcc for the GPU at hand (-arch=native).
    None (and a printed reason) where nvcc is missing or the build or run fails."""
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    src = os.path.join(ROOT, "benchmarks", "mma_peak.cu")
    with tempfile.TemporaryDirectory() as d:
        exe, js = os.path.join(d, "mma_peak"), os.path.join(d, "mma_peak.json")
        try:
            subprocess.run([nvcc, "-O3", "-arch=native", src, "-o", exe], check=True, capture_output=True,
                           text=True, timeout=300)
            subprocess.run([exe, "--json", js], check=True, capture_output=True, text=True, timeout=120)
            rows = json.load(open(js))["rows"]
        except (OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
            err = getattr(e, "stderr", "") or ""
            print(f"mma.sync rate not measured ({type(e).__name__}: {str(e)[:120]} {err[-200:]})")
            return None
    best = max(r["tflops"] for r in rows if r["operands"] == "registers")
    return best * 1e12
