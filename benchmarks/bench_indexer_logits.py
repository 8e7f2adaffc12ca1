"""Benchmark: indexer logits (ours, Triton) vs SGLang 0.5.23's torch SM120 fallback.

The competitor is `fp8_paged_mqa_logits_torch_sm120`, read from the 0.5.23 wheel unzipped under
.sglang/sglang-0.5.23 (git-ignored): its source is taken out of indexer.py with `ast` and executed
with the names it uses (torch, F, FP8_DTYPE, Any) -- the module itself cannot be imported without
SGLang's whole dependency tree. If the file is absent the bench says so and skips the competitor.

Floors: bytes = KV bytes read (132 B per valid token) + q + weights + logits written; byte floor =
bytes / copy bandwidth measured in the same run (read+write of a 1 GiB copy). Prefill also reports the
fp8 FLOP floor (2*rows*avg_len*H*128 at the torch._scaled_mm rate measured in the same run).

usage: python benchmarks/bench_indexer_logits.py --out DIR [--quick] [--sweep]
"""
import argparse
import ast
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from deepseek_v4_kernel.ops import indexer_logits as op  # noqa: E402
from deepseek_v4_kernel.reference import indexer_logits as ref  # noqa: E402
from bench_common import copy_bw, fp8_flops, timeit, timeit_graph  # noqa: E402  (this directory is sys.path[0])

SGL_FILE = os.path.join(ROOT, ".sglang", "sglang-0.5.23", "sglang", "srt", "layers", "attention",
                        "dsv4", "indexer.py")


def load_sglang_fallback():
    if not os.path.exists(SGL_FILE):
        return None, f"missing {SGL_FILE}"
    src = open(SGL_FILE).read()
    tree = ast.parse(src)
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "fp8_paged_mqa_logits_torch_sm120"]
    if not fn:
        return None, "fp8_paged_mqa_logits_torch_sm120 not found in wheel file"
    mod = ast.Module(body=fn, type_ignores=[])
    from typing import Any
    ns = {"torch": torch, "F": F, "FP8_DTYPE": torch.float8_e4m3fn, "Any": Any}
    exec(compile(mod, SGL_FILE, "exec"), ns)
    return ns["fp8_paged_mqa_logits_torch_sm120"], "loaded from sglang 0.5.23 wheel (ast extract)"


def make_cache(B, ctx, H=64, N=1, shared_pages=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = (ctx + 63) // 64
    nb = pages_per if shared_pages else B * pages_per
    # random bytes as fp8 values (avoid NaN encodings: keep exponent bits sane), positive scales
    vals = (torch.randn(nb, 64, 128, device="cuda", generator=g)).to(torch.float8_e4m3fn)
    cache = torch.empty(nb, 64 * 132, dtype=torch.uint8, device="cuda")
    cache[:, :8192] = vals.view(nb, -1).view(torch.uint8)
    sc = torch.rand(nb, 64, device="cuda", generator=g) * 0.01 + 1e-3
    cache[:, 8192:] = sc.view(torch.uint8).view(nb, 256)
    cache = cache.view(nb, 64, 1, 132)
    if shared_pages:
        bt = torch.randperm(nb, device="cuda", generator=g).int()[None, :].expand(B, -1).contiguous()
    else:
        bt = torch.randperm(nb, device="cuda", generator=g).int().view(B, pages_per)
    q = torch.randn(B, N, H, 128, device="cuda", generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(B * N, H, device="cuda", generator=g)
    return q, cache, w, bt


def bench_decode(B, ctx, bw, sgl, N=1, H=64, torch_budget_gb=30.0):
    q, cache, w, bt = make_cache(B, ctx, H=H, N=N)
    lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    lens2 = lens[:, None].expand(B, N).contiguous()  # DeepGEMM 2-D lens [b, next_n]
    meta = op.get_paged_mqa_logits_metadata(lens2, 64, 132)
    ours = lambda: op.fp8_paged_mqa_logits(q, cache, w, lens2, bt, meta, ctx, False)  # noqa: E731
    t_ours, _ = timeit_graph(ours)
    t_ours_eager = timeit(ours)
    nbytes = B * ctx * 132 + q.numel() + w.numel() * 4 + B * N * ctx * 4
    floor_us = nbytes / bw * 1e6
    row = dict(kind="decode", b=B, next_n=N, heads=H, ctx=ctx, ours_us=t_ours, ours_eager_us=t_ours_eager,
               bytes=nbytes,
               floor_us=floor_us, pct_floor=100 * floor_us / t_ours)
    # torch fallback peak memory ~ B*ctx*(132 gather + 256 bf16 + 128*2 scores...) ; skip if too big
    est_gb = B * ctx * (132 + 256 + 2 * H * 2 + 16) / 1e9 if sgl else 0
    if sgl is not None and est_gb < torch_budget_gb:
        try:
            fb = lambda: sgl(q, cache, w, lens2, bt, None, ctx, False)  # noqa: E731
            o_ref = fb()
            o = ours()
            fin = torch.isfinite(o_ref)
            rel = ((o[fin] - o_ref[fin]).norm() / o_ref[fin].norm()).item()
            if est_gb > 2:
                t_t, graphed = timeit(fb, iters=5, warmup=1), False
            else:
                t_t, graphed = timeit_graph(fb, reps=3, iters=5)
            row.update(torch_us=t_t, torch_graphed=graphed, speedup=t_t / t_ours, rel_l2_vs_torch=rel)
        except torch.cuda.OutOfMemoryError:
            row.update(torch_us=None, note="torch fallback OOM")
        torch.cuda.empty_cache()
    else:
        row.update(torch_us=None, note=f"torch fallback skipped (est {est_gb:.0f} GB)")
    return row


def bench_prefill(rows, ctx, bw, flops, sgl, H=64):
    # paged form, as SGLang's SM120 path runs prefill: one row per token, all sharing the request's
    # pages, causal lengths
    q, cache, w, bt = make_cache(rows, ctx, H=H, N=1, shared_pages=True)
    lens = (torch.arange(rows, device="cuda", dtype=torch.int32) * ctx // rows + 1)
    lens2 = lens[:, None]
    t_paged = timeit(lambda: op.fp8_paged_mqa_logits(q, cache, w, lens2, bt, None, ctx, False), iters=10)
    sum_len = int(lens.sum())
    flop = 2.0 * sum_len * H * 128
    # flat form (DeepGEMM fp8_mqa_logits as SGLang's nonpaged path calls it)
    kv8 = cache.view(-1, 8448)[:, :8192].reshape(-1, 64, 128)  # page p holds tokens of page order
    # build a contiguous kv in the request's token order
    pages = bt[0].long()
    k = cache.view(-1, 8448)[pages, :8192].contiguous().view(torch.float8_e4m3fn).view(-1, 128)
    ksc = cache.view(-1, 8448)[pages, 8192:].contiguous().view(torch.float32).view(-1)
    del kv8
    qf = q[:, 0]
    ks = torch.zeros(rows, dtype=torch.int32, device="cuda")
    t_flat = timeit(lambda: op.fp8_mqa_logits(qf, (k, ksc), w, ks, lens, clean_logits=False,
                                              max_seqlen_k=ctx), iters=10)
    out_bytes = rows * ctx * 4
    in_bytes = q.numel() + w.numel() * 4 + ctx * 132
    floor_bytes_us = (in_bytes + out_bytes) / bw * 1e6
    floor_flop_us = flop / flops * 1e6 if flops else None
    row = dict(kind="prefill", rows=rows, ctx=ctx, heads=H, paged_us=t_paged, flat_us=t_flat,
               byte_floor_us=floor_bytes_us, flop_floor_us=floor_flop_us,
               paged_pct_floor=100 * max(floor_bytes_us, floor_flop_us or 0) / t_paged,
               flat_pct_floor=100 * max(floor_bytes_us, floor_flop_us or 0) / t_flat)
    if sgl is not None:
        try:
            fb = lambda: sgl(q, cache, w, lens2, bt, None, ctx, False)  # noqa: E731
            o_ref = fb()
            o = op.fp8_paged_mqa_logits(q, cache, w, lens2, bt, None, ctx, False)
            fin = torch.isfinite(o_ref)
            row["rel_l2_vs_torch"] = ((o[fin] - o_ref[fin]).norm() / o_ref[fin].norm()).item()
            del o, o_ref
            t_t = timeit(fb, iters=3, warmup=1)
            row.update(torch_us=t_t, speedup_paged=t_t / t_paged, speedup_flat=t_t / t_flat)
        except torch.cuda.OutOfMemoryError:
            row["note"] = "torch fallback OOM"
        torch.cuda.empty_cache()
    return row


SWEEP_SHAPES = "32x65536,8x262144"
SWEEP_SPACE = "block_t=64,128;num_warps=4,8;num_stages=2,3;tiles=0,32"   # tiles 0: the _chunk rule


def sweep(bw, shapes=SWEEP_SHAPES, space=SWEEP_SPACE):
    """Every paged-kernel launch config of ``space`` at each ``shapes`` (b x compressed context), CUDA-graph timed;
    "default" rows are what paged_config / _chunk pick."""
    import itertools

    grid = {k: [int(v) for v in vals.split(",")] for k, _, vals in (kv.partition("=") for kv in space.split(";"))}
    res = []
    for shape in shapes.split(","):
        B, ctx = (int(v) for v in shape.split("x"))
        q, cache, w, bt = make_cache(B, ctx)
        lens = torch.full((B, 1), ctx, dtype=torch.int32, device="cuda")
        nbytes = B * ctx * 136
        configs = [None] + [dict(zip(grid, vals)) for vals in itertools.product(*grid.values())]
        for cfg in configs:
            op._TUNE_PAGED.clear()
            if cfg:
                op._TUNE_PAGED.update({k: v for k, v in cfg.items() if k != "tiles" or v})
            try:
                us, _ = timeit_graph(lambda: op.paged_mqa_logits(q, cache, w, lens, bt, ctx, False), reps=5, iters=3)
            except Exception as e:  # noqa: BLE001
                us = None
                print("sweep fail", shape, cfg, str(e)[:100])
            res.append(dict(b=B, ctx=ctx, config=cfg or "default", us=us,
                            pct_floor=(100 * nbytes / bw * 1e6 / us) if us else None))
        del q, cache, w, bt
    op._TUNE_PAGED.clear()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-shapes", default=SWEEP_SHAPES, help="b x compressed context, comma separated")
    ap.add_argument("--sweep-space", default=SWEEP_SPACE, help="key=v,v;... of block_t, num_warps, num_stages, tiles")
    ap.add_argument("--sweep-only", action="store_true", help="skip the tables, run the sweep")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sgl, sgl_note = load_sglang_fallback()
    print("competitor:", sgl_note)
    bw = copy_bw()
    flops = fp8_flops()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s (read+write); fp8 mm {flops / 1e12 if flops else 0:.0f} TFLOP/s")
    results = dict(device=torch.cuda.get_device_name(), copy_bw=bw, fp8_flops=flops, competitor=sgl_note,
                   decode=[], prefill=[], sweep=[])
    bs = [1, 8, 32, 128] if not args.quick else [8]
    ctxs = [8192, 65536, 262144] if not args.quick else [65536]
    if args.sweep_only:
        bs, ctxs = [], []
    print(f"{'b':>4} {'ctx':>7} {'ours us':>9} {'eager us':>9} {'torch us':>10} {'speedup':>8} {'%floor':>7}")
    for B in bs:
        for ctx in ctxs:
            t0 = time.time()
            r = bench_decode(B, ctx, bw, sgl)
            results["decode"].append(r)
            print(f"{B:>4} {ctx:>7} {r['ours_us']:>9.1f} {r['ours_eager_us']:>9.1f} {r.get('torch_us') or float('nan'):>10.1f} "
                  f"{r.get('speedup') or float('nan'):>8.1f} {r['pct_floor']:>7.1f}  ({time.time() - t0:.1f}s)",
                  flush=True)
            torch.cuda.empty_cache()
    for N, H in ((2, 64), (4, 64), (1, 32)) if not args.sweep_only else ():
        try:
            r = bench_decode(32, 65536, bw, None, N=N, H=H)
            results["decode"].append(r)
            print(f"next_n={N} H={H} b=32 ctx=64K ours {r['ours_us']:.1f} us {r['pct_floor']:.1f}% floor", flush=True)
        except Exception as e:  # noqa: BLE001
            print("decode next_n", N, "failed:", repr(e)[:300], flush=True)
    try:
        if args.sweep_only:
            raise RuntimeError("skipped (--sweep-only)")
        r = bench_prefill(8192, 8192, bw, flops, sgl)
        results["prefill"].append(r)
        print("prefill 8192x8K:", json.dumps(r), flush=True)
    except Exception as e:  # noqa: BLE001
        print("prefill failed:", repr(e)[:300], flush=True)
    with open(os.path.join(args.out, "bench_indexer_logits.json"), "w") as f:
        json.dump(results, f, indent=1)
    if args.sweep:
        results["sweep"] = sweep(bw, args.sweep_shapes, args.sweep_space)
        best, default = {}, {}
        for s in results["sweep"]:
            key = (s["b"], s["ctx"])
            if s["config"] == "default":
                default[key] = s
            if s["us"] and (key not in best or s["us"] < best[key]["us"]):
                best[key] = s
        for k, v in best.items():
            d = default.get(k, {}).get("us")
            print("sweep best", k, v, f"default {d:.1f} us" if d else "")
            top = sorted((s for s in results["sweep"] if (s["b"], s["ctx"]) == k and s["us"]), key=lambda s: s["us"])
            for s in top[:5]:
                print("   ", f"{s['us']:.1f} us", s["config"])
    with open(os.path.join(args.out, "bench_indexer_logits.json"), "w") as f:
        json.dump(results, f, indent=1)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass


if __name__ == "__main__":
    main()
