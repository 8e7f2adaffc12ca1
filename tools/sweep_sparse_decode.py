"""Sweep of the mma64 kernel's launch shape at small batches: heads per block (16 / 32 / 64) x split
count, per decode shape, against what the shipped rule (mma64_launch, a cost model fit to this sweep) picks
and against the rule before it (H100: split count from a tile-count model, then the fewest heads per
block whose grid fits one wave; kept here as ``rule_wave_fit``).
Not a test; the data behind the rule (docs/sparse_decode.md). Prints a table per shape and writes JSON.

    python tools/sweep_sparse_decode.py --out build/sweep_sparse_decode [--bs 1,2,4,8,16] [--reps 10]

By default every point runs the 8-warp kernel of its heads per block (how H100 swept); --auto-kernels runs
each on the kernel "auto" would launch for it, which is what tools/fit_launch_model.py should fit the weights to
on a new GPU (--ws64 / --ws / --deep: one warp-specialised kernel for every point, as H100 checked the rule).

Each point is checked against the shipped choice's output on the same inputs (bf16 outputs of two
orderings of the same fp32 sums: max abs difference <= 2^-6 of the output's scale) before it is timed.
Inputs and timing as bench_sparse_decode.py (: KV rows from HBM, q and indices hot, >= 1 ms of
calls per graph replay; --rows-footprint-mb 0 for the L2-warm sets of H100).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

from bench_sparse_decode import DecodeInputs, MAIN_TOKENS, time_fn  # noqa: E402
import deepseek_v4_kernel.ops.sparse_decode as sd  # noqa: E402

HPB_IMPL = {16: "mma64h16", 32: "mma64h32", 64: "mma64"}


def rule_wave_fit(b, s_q, h_q, T, num_sms):
    """(heads per block, splits) of the rule shipped before."""
    tiles = max(1, -(-T // sd.TOK_TILE))
    blocks = b * s_q * (-(-h_q // 64))
    best = None
    for s in range(1, min(sd.MAX_SPLITS, tiles) + 1):
        per = -(-tiles // s)
        s_eff = -(-tiles // per)
        waves = -(-blocks * s_eff // num_sms)
        cost = waves * (per + 1) + (2 if s_eff > 1 else 0)
        if best is None or cost < 0.95 * best[0]:
            best = (cost, s_eff, per)
    splits = best[1]
    for hpb in (16, 32):
        if hpb >= h_q or b * s_q * (-(-h_q // hpb)) * splits <= num_sms:
            return hpb, splits
    return 64, splits


def split_candidates(tiles, max_splits):
    """Split counts with distinct tiles-per-split (what the kernel sees), fewest splits first."""
    out, seen = [], set()
    for s in range(1, min(max_splits, tiles) + 1):
        per = -(-tiles // s)
        if per not in seen:
            seen.add(per)
            out.append(-(-tiles // per))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/sweep_sparse_decode")
    ap.add_argument("--bs", default="1,2,4,8,16")
    ap.add_argument("--hs", default="16,32,64,128")
    ap.add_argument("--sqs", default="1,2")
    ap.add_argument("--extras", default="512,2048")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rows-footprint-mb", type=float, default=160,
                    help="inputs as in bench_sparse_decode.py (default: KV rows from HBM, q and indices hot); "
                         "0: the four L2-warm sets of the sweeps before 2026-11-25")
    ap.add_argument("--ws64", action="store_true",
                    help="time the 64-head points on the warp-specialised kernel (mma64ws, H100) instead of the "
                         "8-warp one, as auto runs them from 4 tiles per block")
    ap.add_argument("--ws", action="store_true",
                    help="time every point on the warp-specialised kernel of its heads per block (mma64ws / "
                         "mma64wsh32 / mma64wsh16, H100; auto: 64 heads from 4 tiles per block, 32 / 16 "
                         "heads always)")
    ap.add_argument("--deep", action="store_true",
                    help="with --ws: the 16-head points on the deep-gather variant instead (mma64wsh16deep, H100; "
                         "auto takes it from DEEP_MIN_TILES tiles per block): the data a refit of the launch rule for it "
                         "would need")
    ap.add_argument("--auto-kernels", action="store_true",
                    help="time every point on the kernel auto runs for it (launch_kernel: the warp-specialised one "
                         "from WS_MIN_TILES tiles per block, the deep 16-head one from DEEP_MIN_TILES, else the 8-warp "
                         "one): the data tools/fit_launch_model.py fits the shipped rule's weights to")
    ap.add_argument("--max-blocks-per-sm", type=int, default=3,
                    help="skip points whose grid has more than this many blocks per SM")
    args = ap.parse_args()
    if (args.ws64 or args.ws or args.deep) and args.auto_kernels:
        ap.error("--auto-kernels times each point on auto's own kernel: without --ws64 / --ws / --deep")
    if args.ws64 or args.ws:
        HPB_IMPL[64] = "mma64ws"
    if args.ws:
        HPB_IMPL.update({32: "mma64wsh32", 16: "mma64wsh16deep" if args.deep else "mma64wsh16"})
    if args.auto_kernels:   # "auto" with the forced (heads per block, splits): launch_kernel picks the kernel
        HPB_IMPL.update({16: "auto", 32: "auto", 64: "auto"})
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda", 0)
    num_sms = sd._sm_count(dev)
    gen = torch.Generator(device="cuda").manual_seed(0)
    pools = DecodeInputs(gen, args.rows_footprint_mb)
    orig_choose, orig_launch = sd.choose_splits, sd.mma64_launch
    res = {"device": torch.cuda.get_device_name(0), "num_sms": num_sms, "rows_footprint_mb": args.rows_footprint_mb,
           "kernels": dict(HPB_IMPL), "rows": []}
    print(f"{torch.cuda.get_device_name(0)} SMs={num_sms}")
    for b in [int(v) for v in args.bs.split(",")]:
        for h_q in [int(v) for v in args.hs.split(",")]:
            for s_q in [int(v) for v in args.sqs.split(",")]:
                for extra in [int(v) for v in args.extras.split(",")]:
                    T = MAIN_TOKENS + extra
                    tiles = -(-T // sd.TOK_TILE)
                    sets = pools.sets(b, h_q, s_q, extra)
                    hpb_auto, s_auto, _ = sd.mma64_launch(b, s_q, h_q, T, num_sms)
                    ref_out, _ = sd.sparse_decode(**sets[0])
                    t_auto, _ = time_fn(lambda a: sd.sparse_decode(**a), sets, args.reps)
                    row = dict(b=b, h_q=h_q, s_q=s_q, extra=extra, tiles=tiles, auto=(hpb_auto, s_auto),
                               auto_us=t_auto, points=[])
                    scale = float(ref_out.float().abs().max()) + 1e-6
                    for hpb in (16, 32, 64):
                        if hpb > 16 and hpb // 2 >= h_q:   # a block holding only zero m16 tiles beyond h_q
                            continue
                        hb = -(-h_q // hpb)
                        for s in split_candidates(tiles, sd.MAX_SPLITS):
                            if b * s_q * hb * s > args.max_blocks_per_sm * num_sms:
                                continue
                            per = -(-tiles // s)
                            # force this point: the auto path asks mma64_launch, the fixed-heads one choose_splits
                            sd.choose_splits = lambda *a, s=s, per=per, **k: (s, per * sd.TOK_TILE)
                            sd.mma64_launch = lambda *a, hpb=hpb, s=s, per=per, **k: (hpb, s, per * sd.TOK_TILE)
                            try:
                                o, _ = sd.sparse_decode(**sets[0], impl=HPB_IMPL[hpb])
                                diff = float((o.float() - ref_out.float()).abs().max())
                                if not diff <= scale * 2 ** -6:
                                    row["points"].append(dict(hpb=hpb, splits=s, error=f"diff {diff:.3g}"))
                                    continue
                                t, _ = time_fn(lambda a, im=HPB_IMPL[hpb]: sd.sparse_decode(**a, impl=im), sets,
                                               args.reps)
                            finally:
                                sd.choose_splits, sd.mma64_launch = orig_choose, orig_launch
                            row["points"].append(dict(hpb=hpb, splits=s, per=per, us=t))
                    ok = [p for p in row["points"] if "us" in p]
                    best = min(ok, key=lambda p: p["us"])
                    row["best"] = best
                    old = rule_wave_fit(b, s_q, h_q, T, num_sms)
                    row["rule_wave_fit"] = old
                    row["rule_wave_fit_us"] = next((p["us"] for p in ok if (p["hpb"], p["splits"]) == old), None)
                    res["rows"].append(row)
                    print(f"b={b:>3} h={h_q:>3} sq={s_q} extra={extra:>5} | auto {hpb_auto:>2}h x {s_auto:>2} "
                          f"{t_auto:7.2f} us | best {best['hpb']:>2}h x {best['splits']:>2} {best['us']:7.2f} us "
                          f"({t_auto / best['us']:.3f}x) | wave-fit rule {old[0]:>2}h x {old[1]:>2} "
                          f"{row['rule_wave_fit_us'] or float('nan'):7.2f} us | " +
                          " ".join(f"{p['hpb']}h{p['splits']}:{p['us']:.1f}" for p in sorted(ok, key=lambda p: p["us"])[:6]),
                          flush=True)
                    with open(os.path.join(args.out, "sweep_sparse_decode.json"), "w") as f:
                        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
