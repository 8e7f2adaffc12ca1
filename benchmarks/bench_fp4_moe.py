"""Benchmark: MXFP4 routed experts (ours, Triton) vs two torch baselines, DeepSeek-V4-Flash shapes.

Shapes: E=256 experts, topk 6, hidden 4096, I 2048; tokens in {1, 8, 32, 128, 1024, 8192};
routing = a random top-6 of 256 per token (distinct experts), routing weights in (0, 1].
Weights: random packed e2m1 bytes and UE8M0 scales (uint8, 2^-9..2^-3), as in the checkpoint.

Competitors (timed in the same run, eager, host syncs included as they have them):
  torch_dequant_gemm: dequantise the distinct hit experts to bf16 in batched torch ops (table
      lookup * scale), then padded batched bf16 GEMMs (torch.bmm) -- the "dequantise then bf16
      GEMM" approach with no Python loop over experts;
  python_loop: for each hit expert: dequantise its weights, bf16 matmuls on its tokens,
      index_add -- what field fallbacks do.
Ours is timed inside a CUDA graph (several calls per graph, as SGLang decode runs), so host
launch overhead is not in the number; "ours_eager" is reported too.

Floors (measured on this GPU in this run):
  weight-byte floor = (distinct experts hit) * (packed weight bytes + scale bytes) / copy
      bandwidth (read+write of a 1 GiB device copy) -> "% of floor" = floor / ours (decode);
  FLOP floor = 6 * slots * hidden * I / dense bf16 mma rate (torch.mm 8192^3) -> "% FLOP floor".

Against SGLang's MoE runners (fp4_moe_vs_sglang.py: Marlin MXFP4 and FlashInfer's flashinfer_mxfp4 paths, through
SGLang's own weight preparation and call, where SGLang is importable): TP shards 1 / 2 / 4 at 1-256 tokens, rotated
routing, checked against the float64 reference first; columns: µs, % of the weight floor, competitor / ours.

usage: python benchmarks/bench_fp4_moe.py --out DIR [--quick] [--sweep] [--sweep-budget S]
                                        [--impls dequant,dot_scaled,mxfp8,cuda_decode,cuda_stream,cuda_stream_v3,...]
                                        [--tokens 1,8,32] [--inter 1024] [--profile] [--no-baselines]
                                        [--vs marlin,flashinfer_sm120,flashinfer_sm90] [--vs-tp 1,2,4]
                                        [--vs-tokens 1,2,...,256] [--vs-impls default] [--vs-only] [--allow-jit]
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from deepseek_v4_kernel.ops import fp4_moe as op  # noqa: E402
from deepseek_v4_kernel.reference.fp4_moe import E2M1_VALUES, fp4_moe_reference  # noqa: E402
from bench_common import bf16_flops, copy_bw, kernel_times, timeit, timeit_graph  # noqa: E402  (this directory is sys.path[0])
import fp4_moe_vs_sglang as vs  # noqa: E402

E, TOPK, H, I = 256, 6, 4096, 2048
TOKENS = [1, 8, 32, 128, 1024, 8192]
LIMIT, RSF = 10.0, 1.5


# ----------------------------------------------------------------------------- baselines
_TABLE = {}


def dequant_bf16(packed, scale):
    """[..., N, K/2] uint8 + [..., N, K/32] uint8 -> [..., N, K] bf16 (torch ops)."""
    dev = packed.device
    if dev not in _TABLE:
        _TABLE[dev] = torch.tensor(E2M1_VALUES, dtype=torch.bfloat16, device=dev)
    t = _TABLE[dev]
    b = packed.view(torch.uint8)
    v = torch.stack([t[(b & 15).int()], t[(b >> 4).int()]], dim=-1).flatten(-2)
    s = torch.exp2(scale.float() - 127).to(torch.bfloat16)
    return (v.unflatten(-1, (-1, 32)) * s[..., None]).flatten(-2)


def _act(gu, lim):
    g, u = gu.chunk(2, dim=-1)
    g = g.clamp(max=lim)
    u = u.clamp(-lim, lim)
    return torch.nn.functional.silu(g) * u


def python_loop(x, w13, s13, w2, s2, tw, ids, lim, rsf):
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        if e < 0:
            continue
        t, k = torch.nonzero(ids == e, as_tuple=True)
        W13 = dequant_bf16(w13[e], s13[e])
        W2 = dequant_bf16(w2[e], s2[e])
        h = _act(x[t] @ W13.T, lim)
        y = h @ W2.T
        out.index_add_(0, t, y.float() * tw[t, k, None])
    return (out * rsf).bfloat16()


def torch_dequant_gemm(x, w13, s13, w2, s2, tw, ids, lim, rsf, chunk=32):
    M = x.shape[0]
    flat = ids.view(-1)
    uniq, inv = torch.unique(flat, return_inverse=True)  # experts hit (host sync for the size)
    U = uniq.numel()
    counts = torch.bincount(inv, minlength=U)
    maxc = int(counts.max())
    order = torch.argsort(inv, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(flat.numel(), device=x.device) - starts[inv[order]]
    xp = torch.zeros(U, maxc, x.shape[1], dtype=torch.bfloat16, device=x.device)
    xp[inv[order], pos] = x[order // TOPK]
    yp = torch.empty(U, maxc, w2.shape[1], dtype=torch.bfloat16, device=x.device)
    for c0 in range(0, U, chunk):  # chunks of experts only to bound the bf16 weight copy
        sel = uniq[c0:c0 + chunk]
        W13 = dequant_bf16(w13[sel], s13[sel])
        h = _act(torch.bmm(xp[c0:c0 + chunk], W13.transpose(1, 2)), lim)
        del W13
        W2 = dequant_bf16(w2[sel], s2[sel])
        yp[c0:c0 + chunk] = torch.bmm(h, W2.transpose(1, 2))
        del W2, h
    y = torch.empty(flat.numel(), w2.shape[1], dtype=torch.float32, device=x.device)
    y[order] = yp[inv[order], pos].float()
    y = y.view(M, TOPK, -1) * tw[..., None]
    return (y.sum(1) * rsf).bfloat16()


# ----------------------------------------------------------------------------- setup
def make_weights(seed=0, inter=None):
    I = inter or globals()["I"]  # noqa: N806  (the TP shard's intermediate size; the module's I by default)
    g = torch.Generator(device="cuda").manual_seed(seed)
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), device="cuda", generator=g, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (E, H, I // 2), device="cuda", generator=g, dtype=torch.uint8)
    s13 = torch.randint(118, 125, (E, 2 * I, H // 32), device="cuda", generator=g, dtype=torch.uint8)
    s2 = torch.randint(118, 125, (E, H, I // 32), device="cuda", generator=g, dtype=torch.uint8)
    return w13, s13, w2, s2


def make_routing(M, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.rand(M, E, device="cuda", generator=g).topk(TOPK, dim=1).indices.int()
    tw = torch.rand(M, TOPK, device="cuda", generator=g) * 0.9 + 0.1
    x = torch.randn(M, H, device="cuda", generator=g).bfloat16()
    return x, tw, ids


def weight_bytes(n_experts, scale_bytes=1):
    per = 2 * I * H // 2 + H * I // 2 + (2 * I * H // 32 + H * I // 32) * scale_bytes
    return n_experts * per


def _c(BN, BK, w, st, BM=None):
    g1 = dict(BN=BN, BK=BK, num_warps=w, num_stages=st)
    if BM:
        g1["BM"] = BM
    return {"gemm1": g1, "gemm2": dict(BN=BN, BK=BK, num_warps=w, num_stages=st)}


# H100 sweeps: around the H100 winners (see docs/fp4_moe.md)
DECODE_SWEEP = [_c(32, 256, 2, 3), _c(32, 256, 1, 3), _c(64, 256, 2, 3), _c(64, 256, 4, 3),
                _c(32, 128, 2, 4), _c(64, 128, 2, 4), _c(128, 128, 4, 3)]
MID_SWEEP = [_c(64, 128, 4, 3, BM=32), _c(64, 128, 2, 3, BM=32), _c(64, 256, 2, 3, BM=16),
             _c(64, 64, 4, 4, BM=64), _c(128, 64, 4, 4, BM=32)]
DEQ_PTX_SWEEP = [_c(64, 256, 4, 3), _c(32, 128, 2, 4), _c(64, 128, 4, 4), _c(128, 128, 4, 3),
                 _c(64, 256, 2, 3), _c(128, 256, 8, 3)]
PREFILL_SWEEP = [_c(128, 64, 8, 3, BM=128), _c(64, 64, 4, 4, BM=64), _c(128, 64, 8, 4, BM=128),
                 _c(64, 64, 4, 4, BM=128), _c(128, 64, 4, 4, BM=64), _c(128, 64, 8, 3, BM=64)]


# names the bench takes for the streaming kernels' variants: impl "cuda_stream" with config={"stream": ...}
# (variants: ops/fp4_moe/dispatch.py STREAM_VARIANTS; v2 / v3: the cp.async shared-memory ring, 4 stages at 3 blocks per
# SM / 3 at 4; v4 / v5: variants 0 / 3 with two MMA chains per tile). The diagnostics (STREAM_DIAGS, wrong results by
# design, uint8 scales): "diag_loads_vN" = variant N's weight stream without decode / MMA (its memory-side ceiling),
# "diag_compute_vN" = its decode + MMA on weights loaded once (its compute-side ceiling).
STREAM_IMPLS = {"cuda_stream": None, "cuda_stream_v1": {"variant": 1}, "cuda_stream_w4": {"wpi1": 4, "wpi2": 4},
                "cuda_stream_v1w4": {"variant": 1, "wpi1": 4, "wpi2": 4},
                **{f"cuda_stream_v{v}": {"variant": v} for v in (2, 3, 4, 5)},
                **{f"cuda_stream_diag_{d}_v{v}": {"variant": v, "diag": d}
                   for d, (_, vs_) in op.dispatch.STREAM_DIAGS.items() for v in vs_}}
DIAG_IMPLS = tuple(k for k in STREAM_IMPLS if "_diag_" in k)


def run_ours(x, w, tw, ids, impl, out, config=None):
    if impl in STREAM_IMPLS:
        impl, config = "cuda_stream", ({"stream": STREAM_IMPLS[impl]} if STREAM_IMPLS[impl] else None)
    return op.fp4_moe(x, *w, tw, ids, swiglu_limit=LIMIT, routed_scaling_factor=RSF, impl=impl,
                      out=out, config=config)


def check_small(w, impls):
    """Spot check at 8 tokens vs the float64 reference (relative to the output scale)."""
    x, tw, ids = make_routing(8, seed=7)
    ref = fp4_moe_reference(x, *w, tw, ids, swiglu_limit=LIMIT, routed_scaling_factor=RSF)
    res = {}
    for impl in impls:
        if impl in DIAG_IMPLS:   # wrong by design
            continue
        o = run_ours(x, w, tw, ids, impl, None)
        res[impl] = float((o.double() - ref).abs().max() / ref.abs().max())
    o = python_loop(x, *w, tw, ids, LIMIT, RSF)
    res["python_loop"] = float((o.double() - ref).abs().max() / ref.abs().max())
    o = torch_dequant_gemm(x, *w, tw, ids, LIMIT, RSF)
    res["torch_dequant_gemm"] = float((o.double() - ref).abs().max() / ref.abs().max())
    return res


def main():
    global I   # --inter: the weights and the floor of a TP shard
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-budget", type=float, default=120.0)
    ap.add_argument("--sweep-set", default="wide", choices=["exact", "wide"],
                    help="exact: the exact impls at decode / mid / prefill sizes; wide: every impl and regime")
    ap.add_argument("--impls", default="dequant,dot_scaled,mxfp8,cuda_decode,cuda_stream",
                    help="impls of fp4_moe, and the streaming kernels' variants " + ",".join(STREAM_IMPLS))
    ap.add_argument("--inter", type=int, default=I, help="I (a TP shard of DeepSeek-V4-Flash's 2048: 1024, 512, 256)")
    ap.add_argument("--tokens", default=None, help="comma-separated token counts (default: the table's)")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--profile", action="store_true", help="per-kernel times of each impl at <= 32 tokens")
    vs.add_args(ap)
    args = ap.parse_args()
    I = args.inter
    os.makedirs(args.out, exist_ok=True)
    impls = args.impls.split(",")
    t_start = time.time()
    dev = torch.cuda.get_device_name()
    bw = copy_bw()
    fl = bf16_flops()
    print(f"device {dev}; copy bandwidth {bw / 1e12:.2f} TB/s (read+write); bf16 mm {fl / 1e12:.0f} TFLOP/s")
    w = None if args.vs_only else make_weights()
    result = {"device": dev, "copy_bw_Bps": bw, "bf16_flops": fl, "E": E, "topk": TOPK, "hidden": H,
              "I": I, "rows": [], "sweep": [], "check": {}}
    if not args.vs_only:
        try:
            result["check"] = check_small(w, impls)
            print("spot check max|err|/max|ref| at 8 tokens:", {k: f"{v:.2e}" for k, v in result["check"].items()})
        except Exception as e:  # noqa: BLE001
            print("spot check failed:", repr(e)[:300])
            result["check"] = {"error": repr(e)[:300]}

    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else [1, 32, 8192] if args.quick else TOKENS
    if args.vs_only:
        tokens = []
    else:
        w_f32 = (w[0], torch.exp2(w[1].float() - 127), w[2], torch.exp2(w[3].float() - 127))  # SGLang's scale form
    for M in tokens:
        x, tw, ids = make_routing(M, seed=M)
        U = int(torch.unique(ids).numel())
        S = M * TOPK
        floor_us = weight_bytes(U) / bw * 1e6
        flop_us = 6 * S * H * I / fl * 1e6
        row = {"tokens": M, "experts_hit": U, "weight_floor_us": floor_us, "flop_floor_us": flop_us,
               "default_impl": op.pick_impl(x, w[0], w[2], TOPK),
               "weight_floor_f32_scales_us": weight_bytes(U, 4) / bw * 1e6}
        out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")
        for impl in impls:
            if impl == "cuda_decode" and S > op.DECODE_MAX_SLOTS:
                continue
            if impl in STREAM_IMPLS and S > op.STREAM_MAX_SLOTS:
                continue
            try:
                us, graphed = timeit_graph(lambda: run_ours(x, w, tw, ids, impl, out),
                                           reps=10 if M <= 1024 else 2, iters=10 if M <= 1024 else 5)
                row[f"{impl}_us"] = us
                row[f"{impl}_graph"] = graphed
                row[f"{impl}_eager_us"] = timeit(lambda: run_ours(x, w, tw, ids, impl, out), iters=5)
                row[f"{impl}_config"] = op.LAST_KERNELS["config"][:2]
                if "gemm1" in op.LAST_KERNELS:   # Triton impls (cuda_decode: static 6 KB, nvcc-checked)
                    row[f"{impl}_smem"] = [op.LAST_KERNELS["gemm1"].metadata.shared,
                                           op.LAST_KERNELS["gemm2"].metadata.shared]
                if args.profile and M <= 32:
                    row[f"{impl}_kernels_us"] = kernel_times(lambda: run_ours(x, w, tw, ids, impl, out))
                    print(f"M={M} {impl} kernels (us):", {k: round(v, 1) for k, v in row[f"{impl}_kernels_us"].items()})
                if M <= 32 and (impl == "dequant" or impl.startswith("cuda_")) and impl not in DIAG_IMPLS:
                    # float32 scales, as SGLang keeps them (the diagnostics exist for uint8 scales only)
                    row[f"{impl}_f32_scales_us"], _ = timeit_graph(
                        lambda: run_ours(x, w_f32, tw, ids, impl, out), reps=10, iters=10)
            except Exception as e:  # noqa: BLE001
                row[f"{impl}_error"] = repr(e)[:300]
                print(f"M={M} {impl} failed: {repr(e)[:300]}")
        if not args.no_baselines:
            for name, fn in (("torch_dequant_gemm", torch_dequant_gemm), ("python_loop", python_loop)):
                try:
                    row[f"{name}_us"] = timeit(lambda: fn(x, *w, tw, ids, LIMIT, RSF),
                                               iters=3 if M >= 1024 else 5, warmup=1)
                except Exception as e:  # noqa: BLE001
                    row[f"{name}_error"] = repr(e)[:300]
                    print(f"M={M} {name} failed: {repr(e)[:300]}")
                torch.cuda.empty_cache()
        ours = [row[f"{i}_us"] for i in impls if f"{i}_us" in row and i not in DIAG_IMPLS]
        if ours:
            best = min(ours)
            row["best_us"] = best
            row["best_impl"] = [i for i in impls if row.get(f"{i}_us") == best and i not in DIAG_IMPLS][0]
            row["pct_weight_floor"] = 100 * floor_us / best
            f32 = [row[f"{i}_f32_scales_us"] for i in impls if f"{i}_f32_scales_us" in row]
            if f32:
                row["pct_weight_floor_f32_scales"] = 100 * row["weight_floor_f32_scales_us"] / min(f32)
            row["pct_flop_floor"] = 100 * flop_us / best
            for name in ("torch_dequant_gemm", "python_loop"):
                if f"{name}_us" in row:
                    row[f"speedup_vs_{name}"] = row[f"{name}_us"] / best
        result["rows"].append(row)
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                          if not k.endswith("_config")}))
        json.dump(result, open(os.path.join(args.out, "bench_fp4_moe.json"), "w"), indent=1)

    if args.vs.strip() or args.vs_only:   # its own weights per TP shard: ours go first (GiBs)
        w = w_f32 = None
        torch.cuda.empty_cache()
        def save(res):
            result["vs_sglang"] = res
            json.dump(result, open(os.path.join(args.out, "bench_fp4_moe.json"), "w"), indent=1)
        result["vs_sglang"] = vs.run(args, sys.modules[__name__], bw, on_row=save)
        json.dump(result, open(os.path.join(args.out, "bench_fp4_moe.json"), "w"), indent=1)

    if args.sweep:
        w = w if w is not None else make_weights()
        sweep_t0 = time.time()
        plan = []  # most informative first (the budget may cut the tail)
        if args.sweep_set == "exact":
            exact = [i for i in impls if i != "mxfp8"]
            for M, cfgs, which in ((32, DECODE_SWEEP, exact), (8192, PREFILL_SWEEP, ["dot_scaled"]),
                                   (1024, MID_SWEEP, exact), (1, DECODE_SWEEP, exact),
                                   (8192, PREFILL_SWEEP[:2], ["dequant"])):
                for impl in which:
                    if impl not in impls:
                        continue
                    for c in cfgs:
                        plan.append((M, impl, c, None))
        else:  # H100: the inline-PTX dequant at decode, and the plain Triton form (A/B)
            for M in (32, 1, 8):
                plan.append((M, "dequant", None, {"DSV4_FP4_MOE_DEQ_PTX": "0"}))
                for c in DEQ_PTX_SWEEP:
                    plan.append((M, "dequant", c, None))
        for M, impl, c, env in plan:
            if time.time() - sweep_t0 > args.sweep_budget:
                print("sweep budget used up; stopping")
                break
            x, tw, ids = make_routing(M, seed=M)
            out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")
            rec = {"tokens": M, "impl": impl, "config": c, "env": env}
            old_env = {k: os.environ.get(k) for k in (env or {})}
            os.environ.update(env or {})
            try:
                us, _ = timeit_graph(lambda: run_ours(x, w, tw, ids, impl, out, c),
                                     reps=10 if M <= 1024 else 2, iters=5)
                rec["us"] = us
                rec["smem"] = [op.LAST_KERNELS["gemm1"].metadata.shared, op.LAST_KERNELS["gemm2"].metadata.shared]
                rec["n_regs"] = [getattr(op.LAST_KERNELS["gemm1"], "n_regs", None),
                                 getattr(op.LAST_KERNELS["gemm2"], "n_regs", None)]
                rec["n_spills"] = [getattr(op.LAST_KERNELS["gemm1"], "n_spills", None),
                                   getattr(op.LAST_KERNELS["gemm2"], "n_spills", None)]
            except Exception as e:  # noqa: BLE001
                rec["error"] = repr(e)[:300]
            finally:
                for k, v in old_env.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            result["sweep"].append(rec)
            print("sweep", json.dumps(rec))
            json.dump(result, open(os.path.join(args.out, "bench_fp4_moe.json"), "w"), indent=1)

    # table
    lines = ["| tokens | experts hit | default | " + " | ".join(f"{i} µs" for i in impls)
             + " | torch dequant+GEMM µs | python loop µs | best vs torch | best vs loop"
             + " | % weight floor | % FLOP floor |",
             "|" + "---|" * (len(impls) + 9)]
    for r in result["rows"]:
        def f(k, fmt="{:.1f}"):
            return fmt.format(r[k]) if k in r else "-"
        lines.append(f"| {r['tokens']} | {r['experts_hit']} | {r['default_impl']} | "
                     + " | ".join(f(f"{i}_us") for i in impls)
                     + f" | {f('torch_dequant_gemm_us')} | {f('python_loop_us')}"
                     + f" | {f('speedup_vs_torch_dequant_gemm', '{:.1f}x')} | {f('speedup_vs_python_loop', '{:.1f}x')}"
                     + f" | {f('pct_weight_floor', '{:.0f}%')} | {f('pct_flop_floor', '{:.1f}%')} |")
    table = "\n".join(lines) if result["rows"] else ""
    if "vs_sglang" in result:
        summary = vs.ratio_summary(result["vs_sglang"])
        table += ("\n\n" if table else "") + vs.table(result["vs_sglang"]) + (f"\n{summary}" if summary else "")
    print(table)
    open(os.path.join(args.out, "table.md"), "w").write(
        f"{dev}; copy {bw / 1e12:.2f} TB/s; bf16 {fl / 1e12:.0f} TFLOP/s\n\n{table}\n")
    result["wall_s"] = time.time() - t_start
    json.dump(result, open(os.path.join(args.out, "bench_fp4_moe.json"), "w"), indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        n_ax = 2 if result.get("vs_sglang", {}).get("rows") else 1
        fig, axes = plt.subplots(1, n_ax, figsize=(7 * n_ax, 4), squeeze=False)
        ax = axes[0][0]
        if n_ax == 2:
            vs.plot(axes[0][1], result["vs_sglang"], dev)
        toks = [r["tokens"] for r in result["rows"]]
        for k in [f"{i}_us" for i in impls] + ["torch_dequant_gemm_us", "python_loop_us"]:
            ys = [r.get(k) for r in result["rows"]]
            if any(y is not None for y in ys):
                ax.plot([t for t, y in zip(toks, ys) if y], [y for y in ys if y], marker="o", label=k[:-3])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("µs")
        ax.legend()
        ax.set_title(f"fp4_moe E={E} topk={TOPK} H={H} I={I} ({dev})")
        fig.savefig(os.path.join(args.out, "bench_fp4_moe.png"), dpi=100, bbox_inches="tight")
    except Exception as e:  # noqa: BLE001
        print("no plot:", repr(e)[:100])


if __name__ == "__main__":
    main()
