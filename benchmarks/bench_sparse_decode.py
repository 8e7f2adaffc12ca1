#!/usr/bin/env python
"""Benchmark the sparse FP8 MLA decode kernel (CUDA graphs, CUDA events, median of reps, rotating
input sets) vs a torch GPU implementation (fp32 math) and SGLang 0.5.23's SM120 Triton fallback
(flash_mla_sm120_triton.py from the 0.5.23 wheel that scripts/fetch_sglang_wheels.sh unpacks, or
--sglang-triton), and, where SGLang and FlashInfer's native SM120 sparse-MLA module import (an SGLang image on
an SM120 GPU), SGLang's own dispatcher on its default FlashInfer path (column 'sgl-fi'), plus the byte/FLOP
floor from copy bandwidth and a bf16 matmul rate measured in the same run, and the share of the mma.sync ceiling
(benchmarks/mma_peak.cu, same run: the kernel's own instruction class; on an H100 the matmul rate is a wgmma rate).
Writes JSON (+PNG) into --out.

Inputs as a decode step leaves them (default, --rows-footprint-mb 160): q, the indices and the lengths are one
set of tensors shared by every call of a shape (hot in L2, as the q projection and the indexer's top-k write
them right before the call in serving), while the calls read their KV rows through different views of one
large cache pool (each view shifted by whole pages), so that the rows one CUDA-graph replay reads add up to
more than three times the H100's 50 MB L2 and come from HBM (in serving, the other layers' weights and caches
stream through L2 between two calls of a layer). --rows-footprint-mb 0: the benchmark before 2026-11-25,
four input sets each with its own q and indices; their rows stay in L2 at b <= 32 (b = 1 reads ~0.4 MB)."""
import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from deepseek_v4_kernel.ops.sparse_decode import sparse_decode, choose_splits, _sm_count, resolve_impl, IMPL  # noqa: E402
from deepseek_v4_kernel.patch.targets import TARGETS  # noqa: E402
from bench_common import mma_sync_flops  # noqa: E402  (this directory is sys.path[0])


def make_cache(num_tokens, page_size, gen, pad=0):
    pages = -(-num_tokens // page_size)
    stride = page_size * 584 + pad
    raw = torch.zeros(pages * stride, dtype=torch.uint8, device="cuda")
    r2 = raw.view(pages, stride)
    data = torch.as_strided(raw, (pages, page_size, 576), (stride, 576, 1))
    scales = torch.as_strided(raw, (pages, page_size, 8), (stride, 8, 1), page_size * 576)
    data[..., :448] = torch.randn(pages, page_size, 448, device="cuda", generator=gen).to(torch.float8_e4m3fn).view(torch.uint8)
    data[..., 448:] = torch.randn(pages, page_size, 64, device="cuda", generator=gen).bfloat16().view(torch.uint8)
    scales[..., :7] = torch.randint(122, 128, (pages, page_size, 7), device="cuda", generator=gen, dtype=torch.uint8)
    del r2
    return torch.as_strided(raw, (pages, page_size, 1, 584), (stride, 584, 584, 1))


MAIN_TOKENS = 128   # DeepSeek-V4's main (compressed) top-k; the extra (window) list varies per shape


class DecodeInputs:
    """Input sets of one decode shape, as a decode step leaves them (see the module docstring).

    cold (rows_footprint_mb > 0): one q / indices / lengths / sink set per shape shared by all calls, and as
    many views of the cache pools (view v starts v * MAIN_SHIFT main pages / v * EXTRA_SHIFT extra pages in;
    whole-page shifts keep the kernel's alignment rules) as it takes for the rows of one pass over the sets
    to reach rows_footprint_mb. Otherwise (and in warm_sets) four sets with their own q and indices on one view."""
    MAIN_PAGE, EXTRA_PAGE = 256, 64
    MAIN_PAGES, EXTRA_PAGES = 65536 // 256, 262144 // 64
    MAIN_SHIFT, EXTRA_SHIFT, MAX_VIEWS = 1, 4, 512

    def __init__(self, gen, rows_footprint_mb=160):
        self.gen, self.footprint = gen, rows_footprint_mb
        self.cold = rows_footprint_mb > 0
        views = self.MAX_VIEWS if self.cold else 1
        self.main = make_cache((self.MAIN_PAGES + (views - 1) * self.MAIN_SHIFT) * self.MAIN_PAGE, self.MAIN_PAGE,
                               gen, pad=576)
        self.extra = make_cache((self.EXTRA_PAGES + (views - 1) * self.EXTRA_SHIFT) * self.EXTRA_PAGE,
                                self.EXTRA_PAGE, gen)

    def view(self, v):
        return dict(k_cache=self.main[v * self.MAIN_SHIFT: v * self.MAIN_SHIFT + self.MAIN_PAGES],
                    extra_k_cache=self.extra[v * self.EXTRA_SHIFT: v * self.EXTRA_SHIFT + self.EXTRA_PAGES])

    def inputs(self, b, h_q, s_q, extra):
        dev, gen = "cuda", self.gen
        return dict(
            q=torch.randn(b, s_q, h_q, 512, device=dev, generator=gen).bfloat16(),
            indices=torch.randint(0, 65536, (b, s_q, MAIN_TOKENS), device=dev, generator=gen, dtype=torch.int32),
            topk_length=torch.full((b,), MAIN_TOKENS, dtype=torch.int32, device=dev),
            extra_indices=torch.randint(0, 262144, (b, s_q, extra), device=dev, generator=gen, dtype=torch.int32),
            extra_topk_length=torch.full((b,), extra, dtype=torch.int32, device=dev),
            attn_sink=torch.randn(h_q, device=dev, generator=gen),
        )

    def warm_sets(self, b, h_q, s_q, extra):
        """The benchmark's sets before 2026-11-25: own q and indices per set, one cache view."""
        return [dict(self.inputs(b, h_q, s_q, extra), **self.view(0)) for _ in range(4 if b <= 128 else 2)]

    def sets(self, b, h_q, s_q, extra):
        if not self.cold:
            return self.warm_sets(b, h_q, s_q, extra)
        # rows of one call: 576 data bytes + the 32-byte sector of its scale row
        row_bytes = b * s_q * (MAIN_TOKENS + extra) * (576 + 32)
        n = min(self.MAX_VIEWS, max(4 if b <= 128 else 2, math.ceil(self.footprint * 2 ** 20 / row_bytes)))
        shared = self.inputs(b, h_q, s_q, extra)
        return [dict(shared, **self.view(v)) for v in range(n)]


def torch_impl(q, k_cache, indices, topk_length=None, extra_k_cache=None, extra_indices=None,
               extra_topk_length=None, attn_sink=None, softmax_scale=None):
    """Straightforward torch GPU version (fp32 math) used as a competitor."""
    def gather(cache, idx, lens):
        P, ps = cache.shape[:2]
        st = cache.stride(0)
        u8 = cache.view(torch.uint8)
        data = torch.as_strided(u8, (P, ps, 576), (st, 576, 1))
        sc = torch.as_strided(u8, (P, ps, 8), (st, 8, 1), u8.storage_offset() + ps * 576)
        valid = idx >= 0
        if lens is not None:
            valid &= torch.arange(idx.shape[-1], device=idx.device).view(1, 1, -1) < lens.view(-1, 1, 1)
        ci = idx.clamp_min(0).long()
        page, row = ci // ps, ci % ps
        d = data[page, row]
        s = sc[page, row][..., :7].float()
        nope = d[..., :448].contiguous().view(torch.float8_e4m3fn).float() * torch.exp2(s - 127).repeat_interleave(64, -1)
        rope = d[..., 448:].contiguous().view(torch.bfloat16).float()
        return torch.cat([nope, rope], -1), valid
    k, v = gather(k_cache, indices, topk_length)
    if extra_k_cache is not None:
        k2, v2 = gather(extra_k_cache, extra_indices, extra_topk_length)
        k, v = torch.cat([k, k2], 2), torch.cat([v, v2], 2)
    scale = softmax_scale or 512 ** -0.5
    s = torch.einsum("bshd,bstd->bsht", q.float(), k) * scale
    s = s.masked_fill(~v.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(s, -1)
    w = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    out = torch.einsum("bsht,bstd->bshd", w, k)
    if attn_sink is not None:
        out = out / (1 + torch.exp(attn_sink.view(1, 1, -1) - lse)).unsqueeze(-1)
    return out.bfloat16(), lse.transpose(1, 2)


def load_triton_fallback(path):
    spec = importlib.util.spec_from_file_location("sgl_flash_mla_sm120_triton", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _flatten_rows(sets, b, s_q):
    """SGLang's call sites pass one query position per row: q, indices and lengths flattened to b * s_q rows
    (prepared once per input set, outside the timed calls)."""
    for a in sets:
        a["tri_idx"] = a["indices"].reshape(b * s_q, 1, -1)
        a["tri_eidx"] = a["extra_indices"].reshape(b * s_q, 1, -1)
        a["tri_len"] = a["topk_length"].repeat_interleave(s_q)
        a["tri_elen"] = a["extra_topk_length"].repeat_interleave(s_q)


def triton_fallback_call(tri, sets, b, s_q, h_q):
    """SGLang's Triton fallback as SGLang calls it -> fn(set)."""
    _flatten_rows(sets, b, s_q)

    def fn(a):
        return tri.flash_mla_sparse_decode_triton(
            a["q"].reshape(b * s_q, 1, h_q, 512), a["k_cache"], a["tri_idx"], a["tri_len"], a["attn_sink"], 512, None,
            extra_k_cache=a["extra_k_cache"], extra_indices=a["tri_eidx"], extra_topk_length=a["tri_elen"])
    return fn


# SGLang's SM120 dispatcher module per version range, newest first: the patch table's rows for it (0.5.16+ and
# 0.5.13 .. 0.5.15.post1), so that the two cannot drift
FLASHINFER_DISPATCHERS = tuple(reversed([t.module for t in TARGETS if t.attr == "flash_mla_with_kvcache_sm120"]))


def load_flashinfer_dispatcher():
    """SGLang's SM120 sparse-decode dispatcher as it runs by default where FlashInfer ships its native SM120 kernel
    (flashinfer.mla._sparse_mla_sm120; backend "flashinfer", SGLANG_SM120_FLASHMLA_BACKEND unset): what an SGLang
    image runs on SM120 without DSV4_KERNEL_PREFER=ours, the number that says whether that switch pays. SGLang's own
    function even where our patch layer replaced it (its __dsv4_original__). Raises, with the reason, where it cannot
    run: no SGLang or no FlashInfer SM120 module (e.g. this H100 machine), or another backend selected."""
    importlib.import_module("flashinfer.mla._sparse_mla_sm120")
    errors = []
    for name in FLASHINFER_DISPATCHERS:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {type(e).__name__}: {e}")
            continue
        backend = getattr(mod, "_sm120_default_backend", None)
        if backend != "flashinfer":
            raise RuntimeError(f"{name} runs backend {backend!r}, not 'flashinfer' (SGLANG_SM120_FLASHMLA_BACKEND)")
        fn = mod.flash_mla_with_kvcache_sm120
        return getattr(fn, "__dsv4_original__", fn)
    raise ImportError("no SGLang SM120 dispatcher: " + "; ".join(errors))


def flashinfer_call(fi, sets, b, s_q, h_q):
    """SGLang's dispatcher (load_flashinfer_dispatcher) with the keywords of SGLang's call site
    (deepseek_v4_backend; docs/sglang_surface.md) -> fn(set)."""
    _flatten_rows(sets, b, s_q)

    def fn(a):
        return fi(q=a["q"].reshape(b * s_q, 1, h_q, 512), k_cache=a["k_cache"], head_dim_v=512, softmax_scale=None,
                  indices=a["tri_idx"], topk_length=a["tri_len"], attn_sink=a["attn_sink"],
                  extra_k_cache=a["extra_k_cache"], extra_indices_in_kvcache=a["tri_eidx"],
                  extra_topk_length=a["tri_elen"])
    return fn


# At least this much work per graph replay: the graph's own launch (several us from the start event to the first
# kernel) is then < 1 % of the time per call. Until 2026-11-25 a graph held 8 calls, which added ~0.8 us to every
# call at b = 1 (8.7-8.8 -> 7.9 us with the same inputs, H100; docs/sparse_decode.md); a decode step's
# graph holds a whole forward pass, so no single call pays that launch.
MIN_GRAPH_US = 1000.0


def _elapsed_us(run):
    """Wall time of run() on the GPU, by CUDA events around it (us)."""
    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    st.record()
    run()
    en.record()
    en.synchronize()
    return st.elapsed_time(en) * 1e3


def time_fn(fn, sets, reps, use_graph=True, min_graph_us=MIN_GRAPH_US):
    """Median us per call. Captures len(sets)*k calls (rotating input sets) in one CUDA graph when
    possible, k so that one replay takes >= min_graph_us; otherwise times an eager loop."""
    for a in sets:
        fn(a)
    torch.cuda.synchronize()
    per_graph = max(len(sets), 8 // len(sets) * len(sets))
    mode = "graph"
    g = None

    def capture(n):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(n):
                fn(sets[i % len(sets)])
        g.replay()
        torch.cuda.synchronize()
        return g

    if use_graph:
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for a in sets:
                    fn(a)
            torch.cuda.current_stream().wait_stream(s)
            g = capture(per_graph)
            t = min(_elapsed_us(g.replay) for _ in range(3))
            if t < min_graph_us:   # more calls per replay, whole rounds of the sets, at most 4096 calls
                k = min(math.ceil(min_graph_us / t), max(1, 4096 // per_graph))
                if k > 1:
                    del g
                    per_graph *= k
                    g = capture(per_graph)
        except Exception as e:  # noqa: BLE001
            g, mode = None, f"eager ({type(e).__name__})"
            torch.cuda.synchronize()

    def eager():
        for i in range(per_graph):
            fn(sets[i % len(sets)])

    run = g.replay if g is not None else eager
    times = [_elapsed_us(run) / per_graph for _ in range(reps)]
    return statistics.median(times), mode


def measure_floors():
    x = torch.empty(512 * 2 ** 20, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record(); y.copy_(x); en.record(); en.synchronize()
        ts.append(st.elapsed_time(en) / 1e3)
    bw = 2 * x.numel() / min(ts)
    del x, y
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record(); a @ b; en.record(); en.synchronize()
        ts.append(st.elapsed_time(en) / 1e3)
    return bw, 2 * 8192 ** 3 / min(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/bench_sparse_decode")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="b in {1, 128} only")
    ap.add_argument("--bs", default="", help="comma list of b (overrides the default / --quick list)")
    ap.add_argument("--max-b-competitors", type=int, default=128)
    ap.add_argument("--impls", default=IMPL,
                    help="comma list of kernels to time (simt, mma, mma64, auto); the first is 'ours'")
    ap.add_argument("--only", default="", help="b,h_q,s_q,extra: time just this shape (e.g. under ncu)")
    ap.add_argument("--min-graph-us", type=float, default=MIN_GRAPH_US,
                    help="calls per CUDA graph so that one replay takes at least this long (0: 8 calls, as "
                         "before 2026-11-25)")
    ap.add_argument("--rows-footprint-mb", type=float, default=160,
                    help="KV-row bytes one graph replay reads at least (MiB; q and indices shared and hot); "
                         "0: four input sets with their own q and indices (rows L2-resident at small b)")
    ap.add_argument("--sglang-triton", default=os.path.join(
        ROOT, ".sglang/sglang-0.5.23/sglang/kernels/ops/attention/flash_mla_sm120_triton.py"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    bw, flops_rate = measure_floors()
    mma_rate = None if args.only else mma_sync_flops()
    print(f"{torch.cuda.get_device_name()}  SMs={_sm_count(dev)}  copy BW {bw / 1e12:.2f} TB/s (read+write)  "
          f"bf16 matmul {flops_rate / 1e12:.0f} TFLOP/s  mma.sync bf16 "
          + (f"{mma_rate / 1e12:.0f} TFLOP/s" if mma_rate else "n/a"))
    try:
        tri = load_triton_fallback(args.sglang_triton)
    except Exception as e:  # noqa: BLE001
        tri = None
        print(f"SGLang Triton fallback unavailable: {type(e).__name__}: {e}")
    try:
        fi = load_flashinfer_dispatcher()
        print("SGLang's FlashInfer SM120 path: timed (column 'sgl-fi us')")
    except Exception as e:  # noqa: BLE001
        fi = None
        print(f"SGLang's FlashInfer SM120 path unavailable (column 'sgl-fi us' n/a): {type(e).__name__}: {e}"[:300])
    gen = torch.Generator(device="cuda").manual_seed(0)
    pools = DecodeInputs(gen, args.rows_footprint_mb)
    cold = pools.cold
    bs = [1, 8, 32, 128, 1024] if not args.quick else [1, 128]
    if args.bs:
        bs = [int(v) for v in args.bs.split(",")]
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    shapes = [(b, h_q, s_q, extra) for h_q in [64, 128] for s_q in [1, 2] for extra in [512, 2048] for b in bs]
    # per-GPU heads at TP2/TP4 when q is not padded to 64: shows which kernel "auto" should pick there
    shapes += [(b, h_q, 1, 512) for h_q in [16, 32] for b in [1, 128]]
    if args.only:
        shapes = [tuple(int(x) for x in args.only.split(","))]
    rows = []
    hdr = f"{'b':>5} {'h':>4} {'sq':>3} {'extra':>6} {'split':>5} | {'ours us':>8} {'torch us':>9} " \
          f"{'sgl-tri us':>10} {'sgl-fi us':>10} | {'x torch':>8} {'x tri':>8} {'x fi':>8} | {'floor us':>8} " \
          f"{'%floor':>7} {'%bytes':>7} {'%flops':>7} {'%mma':>6}" + \
          "".join(f" {i + ' us':>10}" for i in impls[1:]) + f" | {'sets':>4} {'warm us':>8}"
    print(f"ours = {impls[0]}; " + (
        f"KV rows cold: >= {args.rows_footprint_mb:g} MiB of rows per graph replay, q and indices shared (hot); "
        "'warm us': ours on four own-q/indices sets (rows in L2 at small b)"
        if cold else "four input sets per shape with their own q and indices"))
    print(hdr)
    for (b, h_q, s_q, extra) in shapes:
        T = MAIN_TOKENS + extra
        sets = pools.sets(b, h_q, s_q, extra)
        nsets = len(sets)
        nbytes = b * T * 584 + 2 * b * s_q * h_q * 512 * 2
        nflops = 4 * b * s_q * h_q * T * 512
        floor_us = max(nbytes / bw, nflops / flops_rate) * 1e6
        r = dict(b=b, h_q=h_q, s_q=s_q, main=MAIN_TOKENS, extra=extra, impl=resolve_impl(h_q, impls[0]),
                 splits=choose_splits(b, s_q, h_q, T, _sm_count(dev), impls[0])[0],
                 bytes=nbytes, flops=nflops, floor_us=floor_us, input_sets=nsets, rows_cold=cold)
        # correctness spot check vs torch (fp32) on the first set
        o1, l1 = sparse_decode(**sets[0], impl=impls[0])
        if b * s_q * T * 512 * 4 <= 2 ** 31 and not args.only:
            o2, l2 = torch_impl(**sets[0])
            r["max_abs_err_vs_torch"] = float((o1.float() - o2.float()).abs().max())
        for k, im in enumerate(impls):
            key = "ours_us" if k == 0 else f"us_{im}"
            r[key], r[key.replace("us", "mode")] = time_fn(lambda a, im=im: sparse_decode(**a, impl=im),
                                                          sets, args.reps, min_graph_us=args.min_graph_us)
        if cold and b <= 128:   # the same kernel on the old, L2-warm inputs, for comparison
            r["ours_warm_us"], _ = time_fn(lambda a: sparse_decode(**a, impl=impls[0]),
                                           pools.warm_sets(b, h_q, s_q, extra), args.reps,
                                           min_graph_us=args.min_graph_us)
        if args.only:
            print(r)
            continue
        # competitors: every set where the sets are many (small b: otherwise their rows would stay in L2), else
        # two (each set's rows already exceed the L2, and the torch version's intermediates are large)
        comp_sets = sets if nsets > 4 else sets[:2]
        if b * s_q * T * 512 * 4 <= 2 ** 31 and b <= args.max_b_competitors:
            try:
                r["torch_us"], _ = time_fn(lambda a: torch_impl(**a), comp_sets, max(5, args.reps // 4),
                                           min_graph_us=args.min_graph_us)
            except Exception as e:  # noqa: BLE001
                r["torch_err"] = f"{type(e).__name__}: {e}"[:200]
        if tri is not None and b <= args.max_b_competitors:
            tri_fn = triton_fallback_call(tri, comp_sets, b, s_q, h_q)
            try:
                r["sgl_triton_us"], r["sgl_triton_mode"] = time_fn(tri_fn, comp_sets, max(5, args.reps // 4),
                                                                   min_graph_us=args.min_graph_us)
            except Exception as e:  # noqa: BLE001
                r["sgl_triton_err"] = f"{type(e).__name__}: {e}"[:200]
        if fi is not None and b <= args.max_b_competitors:
            try:
                r["sgl_flashinfer_us"], r["sgl_flashinfer_mode"] = time_fn(
                    flashinfer_call(fi, comp_sets, b, s_q, h_q), comp_sets, max(5, args.reps // 4),
                    min_graph_us=args.min_graph_us)
            except Exception as e:  # noqa: BLE001
                r["sgl_flashinfer_err"] = f"{type(e).__name__}: {e}"[:200]
        r["pct_floor"] = 100 * floor_us / r["ours_us"]
        r["pct_bytes"] = 100 * nbytes / bw / (r["ours_us"] * 1e-6)
        r["pct_flops"] = 100 * nflops / flops_rate / (r["ours_us"] * 1e-6)
        if mma_rate:   # share of the mma.sync ceiling (the instruction class of every kernel here)
            r["pct_mma_sync"] = 100 * nflops / mma_rate / (r["ours_us"] * 1e-6)
        rows.append(r)
        f = lambda k: f"{r[k]:.1f}" if k in r else "n/a"  # noqa: E731
        xr = lambda k: f"{r[k] / r['ours_us']:.1f}x" if k in r else "n/a"  # noqa: E731
        print(f"{b:>5} {h_q:>4} {s_q:>3} {extra:>6} {r['splits']:>5} | {f('ours_us'):>8} {f('torch_us'):>9} "
              f"{f('sgl_triton_us'):>10} {f('sgl_flashinfer_us'):>10} | {xr('torch_us'):>8} {xr('sgl_triton_us'):>8} "
              f"{xr('sgl_flashinfer_us'):>8} | {floor_us:>8.1f} "
              f"{r['pct_floor']:>6.1f}% {r['pct_bytes']:>6.1f}% {r['pct_flops']:>6.1f}% "
              + (f"{r['pct_mma_sync']:>5.1f}%" if mma_rate else f"{'n/a':>6}")
              + "".join(f" {r['us_' + i]:>10.1f}" for i in impls[1:])
              + f" | {nsets:>4} {f('ours_warm_us'):>8}", flush=True)
        del sets
    if args.only:
        return
    res = dict(device=torch.cuda.get_device_name(), sms=_sm_count(dev), copy_bw_Bps=bw, bf16_flops=flops_rate,
               mma_sync_bf16_flops=mma_rate,
               impls=impls, rows_footprint_mb=args.rows_footprint_mb,
               torch=torch.__version__, rows=rows, time=time.strftime("%Y-%m-%d %H:%M:%S"))
    with open(os.path.join(args.out, "bench_sparse_decode.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 5))
        for h_q in [64, 128]:
            for s_q in [1, 2]:
                for extra in [512, 2048]:
                    sel = [r for r in rows if r["h_q"] == h_q and r["s_q"] == s_q and r["extra"] == extra]
                    ax.plot([r["b"] for r in sel], [r["pct_floor"] for r in sel], marker="o",
                            label=f"h{h_q} sq{s_q} extra{extra}")
        ax.set_xscale("log"); ax.set_xlabel("b"); ax.set_ylabel("% of floor"); ax.legend(fontsize=7)
        fig.savefig(os.path.join(args.out, "bench_sparse_decode.png"), dpi=100)
    except Exception:  # noqa: BLE001
        pass


if __name__ == "__main__":
    main()
