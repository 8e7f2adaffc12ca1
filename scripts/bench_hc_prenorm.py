"""Benchmark hc_prenorm (DeepGEMM tf32_hc_prenorm_gemm replacement) on one GPU.

Competitors, all timed in this run on this GPU, by CUDA-graph replay (as SGLang decode
runs) with enough distinct buffer sets that x + fn do not stay in L2 (DeepSeek-V4 has
43 layers x 2 distinct fn of 1.5 MiB each, so fn comes from HBM in the model):
  torch_fp32      x.float() @ fn.T and x.float().square().sum(-1) (torch default: no tf32)
  torch_tf32      same with torch.backends.cuda.matmul.allow_tf32 = True
  sgl_hc_pre      SGLang 0.5.17/0.5.23 hc_pre torch path on SM120 (hc_pre_torch_impl:
                  rsqrt(mean(x^2)+eps) * F.linear(x.float(), fn)), vs ours_hc_pre =
                  our GEMM + the DeepGEMM branch's rsqrt/scale (what SGLang runs with the
                  shim and SGLANG_OPT_DEEPGEMM_HC_PRENORM on)
  ours            hc_prenorm_gemm, num_splits None (hc_pre) and SGLang's mhc_pre split
                  count (_compute_num_split_for_mhc_pre, 64-blocks, n_sms // m-tiles)
SGLang's TileLang mhc_pre_gemm_sqrsum kernels are not timed: tilelang is not installed
on the device image and cannot be (no network there; not an allowed dependency).

Byte floor: essential bytes (x + fn + out + sqrsum) / copy bandwidth measured here
(copy BW = (read + write bytes) / time of a 1 GiB device-to-device copy).
Writes <out>/bench_hc_prenorm.json (+ .png when matplotlib is present).
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from deepseek_v4_kernel.ops import hc_prenorm as hp  # noqa: E402

K, N = 16384, 24
EPS = 1e-6


def copy_bw(nbytes=1 << 30, reps=10):
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        b.copy_(a)
    e1.record()
    torch.cuda.synchronize()
    t = e0.elapsed_time(e1) / 1e3 / reps
    del a, b
    return 2 * nbytes / t


_STREAM = None


def time_graph(calls, reps):
    """us per call: capture all calls into one graph, replay reps times."""
    global _STREAM
    if _STREAM is None:
        _STREAM = torch.cuda.Stream()
    s = _STREAM
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:  # eager warm-up on the capture stream (compiles, counters)
            c()
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for c in calls:
                c()
        g.replay()
        s.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(s)
        for _ in range(reps):
            g.replay()
        e1.record(s)
        s.synchronize()
    torch.cuda.current_stream().wait_stream(s)
    return e0.elapsed_time(e1) * 1e3 / (reps * len(calls))


def sglang_num_splits(m, n_sms):
    block_m, block_k = 64, 64
    grid = (m + block_m - 1) // block_m
    nbk = (K + block_k - 1) // block_k
    return max(1, min(n_sms // max(grid, 1), nbk // 4))


def make_sets(m, S, footprint=192 << 20, cap=48):
    per = m * K * 2 + N * K * 4 + S * m * (N + 1) * 4
    r = max(1, min(cap, math.ceil(footprint / per)))
    sets = []
    for i in range(r):
        x = torch.randn(m, K, device="cuda").bfloat16()
        fn = torch.randn(N, K, device="cuda") * 0.05
        out = torch.empty(S, m, N, device="cuda")
        sq = torch.empty(S, m, device="cuda")
        sets.append((x, fn, out, sq))
    return sets, per


def bench_m(m, bw, n_sms, reps, cfg=None):
    res = {"m": m}
    # --- ours, num_splits None (hc_pre path) and SGLang's mhc_pre split count
    for label, S_arg in (("ours", None), ("ours_mhc_splits", sglang_num_splits(m, n_sms))):
        S = S_arg or 1
        sets, per = make_sets(m, S)
        if S_arg is None:
            calls = [lambda s=s: hp.hc_prenorm_gemm(s[0], s[1], s[2][0], s[3][0], None, _config=cfg)
                     for s in sets]
        else:
            calls = [lambda s=s: hp.hc_prenorm_gemm(s[0], s[1], s[2], s[3], S_arg, _config=cfg)
                     for s in sets]
        t = time_graph(calls, reps)
        res[label + "_us"] = t
        res[label + "_splits"] = S
        res[label + "_floor_pct"] = 100 * (per / bw * 1e6) / t
        if S_arg is None:
            res["bytes"] = per
            res["floor_us"] = per / bw * 1e6
            res["config"] = hp.choose_config(m, K, 1, n_sms, cfg)
        del sets
    if cfg is not None:
        return res
    sets, _ = make_sets(m, 1)

    def torch_ref(s):
        xf = s[0].float()
        s[2][0].copy_(xf @ s[1].T)  # SGLang allocates the result; copy keeps buffers fixed
        s[3][0].copy_(xf.square().sum(-1))

    def torch_ref_nocopy(s):
        xf = s[0].float()
        return xf @ s[1].T, xf.square().sum(-1)

    res["torch_fp32_us"] = time_graph([lambda s=s: torch_ref_nocopy(s) for s in sets], reps)
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        res["torch_tf32_us"] = time_graph([lambda s=s: torch_ref_nocopy(s) for s in sets], reps)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False

    def sgl_hc_pre(s):  # SGLang hc_pre_torch_impl (0.5.17 / 0.5.23), SM120 default path
        x_flat = s[0].float()
        rsqrt = torch.rsqrt(x_flat.square().mean(-1, keepdim=True) + EPS)
        return (F.linear(x_flat, s[1]) * rsqrt).unsqueeze(1)

    def ours_hc_pre(s):  # SGLang's DeepGEMM branch with our shim
        hp.sglang_tf32_hc_prenorm_gemm(s[0], s[1], s[2][0], s[3][0], None)
        rsqrt = torch.rsqrt(s[3][0] / K + EPS)
        return (s[2][0] * rsqrt.unsqueeze(1)).unsqueeze(1)

    res["sgl_hc_pre_us"] = time_graph([lambda s=s: sgl_hc_pre(s) for s in sets], reps)
    res["ours_hc_pre_us"] = time_graph([lambda s=s: ours_hc_pre(s) for s in sets], reps)
    res["speedup_vs_torch_fp32"] = res["torch_fp32_us"] / res["ours_us"]
    res["speedup_vs_torch_tf32"] = res["torch_tf32_us"] / res["ours_us"]
    res["speedup_hc_pre"] = res["sgl_hc_pre_us"] / res["ours_hc_pre_us"]
    del sets
    return res


SWEEP = {
    "small": [dict(block_m=16, block_k=64, p=p, num_warps=4, num_stages=3) for p in (32, 64, 128)],
    "mid": [dict(block_m=bm, block_k=64, p=p, num_warps=4, num_stages=3)
            for bm, p in ((16, 32), (16, 64), (32, 16), (64, 16))],
    "large": [dict(block_m=64, block_k=64, p=p, num_warps=4, num_stages=st)
              for (st, p) in ((3, 2), (3, 3), (4, 3))],
}


def sweep(ms, bw, n_sms, reps):
    out = []
    for m in ms:
        group = "small" if m <= 16 else ("mid" if m <= 512 else "large")
        for cfg in SWEEP[group]:
            try:
                smem = hp.compiled_smem(m=min(m, 64), num_splits=1, _config=cfg)
                if smem > hp.SMEM_LIMIT:
                    out.append({"m": m, "config": cfg, "smem": smem, "skipped": "smem"})
                    continue
                r = bench_m(m, bw, n_sms, max(5, reps // 4), cfg)
                out.append({"m": m, "config": cfg, "smem": smem, "us": r["ours_us"],
                            "floor_pct": r["ours_floor_pct"]})
                print(f"  sweep m={m:5d} {cfg} smem={smem} {r['ours_us']:.2f} us "
                      f"({r['ours_floor_pct']:.0f}% floor)", flush=True)
            except Exception as e:  # noqa: BLE001 - record and go on
                out.append({"m": m, "config": cfg, "error": repr(e)[:300]})
                print(f"  sweep m={m} {cfg} ERROR {e!r}"[:300], flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--ms", default="1,8,64,512,8192")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--sweep", action="store_true", help="also time a grid of tile configs")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ms = [int(v) for v in args.ms.split(",")]
    torch.manual_seed(0)
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bw()
    meta = {"device": torch.cuda.get_device_name(0), "n_sms": n_sms, "copy_bw_GBps": bw / 1e9,
            "torch": torch.__version__, "precision": os.environ.get("DSV4_HC_PRENORM_PRECISION",
                                                                    "bf16x2"),
            "tilelang_available": __import__("importlib").util.find_spec("tilelang") is not None}
    print(json.dumps(meta), flush=True)
    rows = []
    t0 = time.time()
    for m in ms:
        r = bench_m(m, bw, n_sms, args.reps)
        rows.append(r)
        print(json.dumps(r), flush=True)
    hdr = (f"{'m':>6} {'ours us':>8} {'%floor':>6} {'mhcS':>4} {'ours(S) us':>10} {'torch32':>8} "
           f"{'torchtf32':>9} {'x fp32':>7} {'x tf32':>7} {'sgl_pre':>8} {'ours_pre':>8} {'x pre':>6}")
    print(hdr)
    for r in rows:
        print(f"{r['m']:>6} {r['ours_us']:8.2f} {r['ours_floor_pct']:6.0f} {r['ours_mhc_splits_splits']:>4} "
              f"{r['ours_mhc_splits_us']:10.2f} {r['torch_fp32_us']:8.2f} {r['torch_tf32_us']:9.2f} "
              f"{r['speedup_vs_torch_fp32']:7.2f} {r['speedup_vs_torch_tf32']:7.2f} "
              f"{r['sgl_hc_pre_us']:8.2f} {r['ours_hc_pre_us']:8.2f} {r['speedup_hc_pre']:6.2f}")
    result = {"meta": meta, "rows": rows, "bench_s": time.time() - t0}
    if args.sweep:
        result["sweep"] = sweep(ms, bw, n_sms, args.reps)
    with open(os.path.join(args.out, "bench_hc_prenorm.json"), "w") as f:
        json.dump(result, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for key in ("ours_us", "torch_fp32_us", "torch_tf32_us", "floor_us"):
            ax.loglog([r["m"] for r in rows], [r[key] for r in rows], "o-", label=key)
        ax.set_xlabel("m (tokens)")
        ax.set_ylabel("us")
        ax.legend()
        ax.set_title(f"hc_prenorm K={K} n={N} on {meta['device']}")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "bench_hc_prenorm.png"), dpi=100)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
