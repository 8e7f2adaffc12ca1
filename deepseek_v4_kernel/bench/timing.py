"""Timing and floors shared by ``python -m deepseek_v4_kernel bench`` and the benchmarks (benchmarks/bench_*.py).

Every number is a per-call device time in µs from CUDA events around CUDA-graph replays (as SGLang's decode runs:
no host launch overhead in the number), except where capture fails (then eager, and the caller is told). The
floors (copy bandwidth, matmul rates) are measured in the same run on the same GPU.
"""

from __future__ import annotations

import math
from typing import Callable, List, Sequence, Tuple

import torch


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


def time_rotated(calls: Sequence[Callable[[], object]], iters: int = 7, budget_ms: float = 60.0
                 ) -> Tuple[float, str]:
    """Per-call µs of ``calls`` (the same op on different input sets, so that what one call reads is not what
    the previous one left in L2): each is run once eagerly (compiles, autotuning, lazy set-up; its errors surface
    here, not as a failed capture), then the calls go, in order, into one CUDA graph, replayed ``iters`` times;
    the median replay over the call count. Slow calls (one replay beyond ``budget_ms``) use fewer sets.
    Returns (µs, how: "graph" or "eager (<why>)"). No host synchronisation inside the timed replays."""
    calls = list(calls)
    if not calls:
        raise ValueError("calls must hold at least one callable, got none")
    calls[0]()   # compiles / autotunes / lazy set-up: not part of the per-call estimate below
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    calls[0]()
    t1.record()
    torch.cuda.synchronize()
    first_ms = t0.elapsed_time(t1)
    keep = max(1, min(len(calls), int(budget_ms / max(first_ms, 1e-3))))
    calls = calls[:keep]
    for c in calls[1:]:
        c()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                for c in calls:
                    c()
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001  (e.g. a host sync inside the call): eager timing, said so
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = None
        us = _eager_rotated(calls, max(2, iters // 2))
        return us, f"eager ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    ts = sorted(s.elapsed_time(e) * 1e3 / len(calls) for s, e in zip(starts, ends))
    graph = None   # (its memory pool goes back before the next measurement)
    return ts[len(ts) // 2], "graph"


def _eager_rotated(calls: List[Callable[[], object]], iters: int) -> float:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        for c in calls:
            c()
        ends[i].record()
    torch.cuda.synchronize()
    ts = sorted(s.elapsed_time(e) * 1e3 / len(calls) for s, e in zip(starts, ends))
    return ts[len(ts) // 2]


def rotation_count(bytes_per_call: float, l2_bytes: int, lo: int = 2, hi: int = 64, factor: float = 4.0) -> int:
    """How many input sets one timed pass cycles through so that what it reads adds up to ``factor`` x L2
    (the data of one call is then not in L2 when it runs again), within [lo, hi]."""
    if bytes_per_call <= 0:
        return lo
    return int(max(lo, min(hi, math.ceil(factor * l2_bytes / bytes_per_call))))


def l2_bytes(device=None) -> int:
    props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or 50 << 20)


def copy_bw(nbytes: int = 1 << 30):
    """Bytes/s of a device-to-device copy of ``nbytes`` (1 GiB by default), read + write counted."""
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    us = timeit(lambda: y.copy_(x), iters=10)
    x = y = None
    return 2 * nbytes / (us * 1e-6)


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
