#!/usr/bin/env python
"""Sparse decode of a TP rank's heads: q padded to 64 heads (what SGLang 0.5.20+ passes on SM120 at <= 64 decode
tokens unless FlashInfer's native kernel runs) against the rank's real heads alone (what it passes where our
sparse decode is its dispatcher: the patch row of MqaAttentionBase._kernel_num_heads, docs/sparse_decode.md
"Unpadded query heads"). Same method as bench_sparse_decode.py (CUDA graphs, median of reps, decode-step inputs:
q / indices hot, KV rows cold); also SGLang 0.5.23's Triton fallback on the padded q (what SGLang runs with
SGLANG_SM120_FLASHMLA_BACKEND=triton) and the byte floor of the real heads' call. Prints a table, writes JSON."""
import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from deepseek_v4_kernel.ops.sparse_decode import mma64_launch, sparse_decode, _sm_count  # noqa: E402
from bench_sparse_decode import (MAIN_TOKENS, DecodeInputs, load_triton_fallback, measure_floors,  # noqa: E402
                                 time_fn, triton_fallback_call)

PADDED = 64   # SGLang's pad for n_local_heads <= 64 (0.5.20+ MqaAttentionBase._kernel_num_heads)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/bench_sparse_decode_tp_heads")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tokens", default="1,4,16,64", help="decode tokens b * s_q (SGLang pads at <= 64)")
    ap.add_argument("--tps", default="2,4,8", help="attention TP sizes (heads per rank = 64 / TP)")
    ap.add_argument("--sq", default="1,2", help="query positions per row (MTP verify: 2)")
    ap.add_argument("--extras", default="512,2048", help="extra (compressed) positions per row")
    ap.add_argument("--no-padded", action="store_true", help="time the rank's heads only (A/B of two libraries)")
    ap.add_argument("--no-triton", action="store_true", help="skip SGLang's Triton fallback")
    ap.add_argument("--sglang-triton", default=os.path.join(
        ROOT, ".sglang/sglang-0.5.23/sglang/kernels/ops/attention/flash_mla_sm120_triton.py"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    bw, _ = measure_floors()
    sms = _sm_count(dev)
    print(f"{torch.cuda.get_device_name()}  SMs={sms}  copy BW {bw / 1e12:.2f} TB/s (read+write)")
    tri = None
    try:
        tri = None if args.no_triton else load_triton_fallback(args.sglang_triton)
    except Exception as e:  # noqa: BLE001
        print(f"SGLang Triton fallback unavailable: {type(e).__name__}: {e}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    pools = DecodeInputs(gen)
    ints = lambda v: [int(x) for x in v.split(",")]  # noqa: E731
    shapes = [(tp, b, s_q, extra) for tp in ints(args.tps) for extra in ints(args.extras) for s_q in ints(args.sq)
              for b in (t // s_q for t in ints(args.tokens)) if b >= 1]
    print(f"{'TP':>3} {'h':>3} {'b':>3} {'sq':>3} {'extra':>6} | {'launch 64':>10} {'launch h':>9} | "
          f"{'padded us':>9} {'ours us':>8} {'x padded':>8} | {'tri pad us':>10} {'x tri':>7} | "
          f"{'floor us':>8} {'%floor':>6} | {'max|d|':>7}")
    rows = []
    for tp, b, s_q, extra in shapes:
        h = PADDED // tp
        T = MAIN_TOKENS + extra
        sets = pools.sets(b, PADDED, s_q, extra)
        for a in sets:   # SGLang pads attn_sink with zeros (_local_attn_sink); q's pad is whatever new_empty held
            a["attn_sink"][h:] = 0
        real = [dict(a, q=a["q"][:, :, :h].contiguous(), attn_sink=a["attn_sink"][:h].contiguous()) for a in sets]
        sliced = {}   # the sets share q and attn_sink (hot): slice each once
        for a, r_ in zip(sets, real):
            r_["q"] = sliced.setdefault(a["q"].data_ptr(), r_["q"])
            r_["attn_sink"] = sliced.setdefault(a["attn_sink"].data_ptr(), r_["attn_sink"])
        o, l = sparse_decode(**real[0])
        diff = float("nan")
        if not args.no_padded:
            o_pad, l_pad = sparse_decode(**sets[0])
            diff = float((o_pad[:, :, :h].float() - o.float()).abs().max())
        r = dict(tp=tp, h_q=h, b=b, s_q=s_q, main=MAIN_TOKENS, extra=extra,
                 launch_padded=mma64_launch(b, s_q, PADDED, T, sms)[:2], launch_real=mma64_launch(b, s_q, h, T, sms)[:2],
                 max_abs_diff=diff)
        r["padded_us"] = float("nan") if args.no_padded else time_fn(lambda a: sparse_decode(**a), sets, args.reps)[0]
        r["ours_us"], _ = time_fn(lambda a: sparse_decode(**a), real, args.reps)
        nbytes = b * T * 584 + 2 * b * s_q * h * 512 * 2
        r["floor_us"] = nbytes / bw * 1e6
        if tri is not None:
            comp = sets if len(sets) > 4 else sets[:2]
            tri_fn = triton_fallback_call(tri, comp, b, s_q, PADDED)
            try:
                r["triton_padded_us"], _ = time_fn(tri_fn, comp, max(5, args.reps // 4))
            except Exception as e:  # noqa: BLE001
                r["triton_err"] = f"{type(e).__name__}: {e}"[:200]
        rows.append(r)
        tri_us = r.get("triton_padded_us")
        print(f"{tp:>3} {h:>3} {b:>3} {s_q:>3} {extra:>6} | {str(r['launch_padded']):>10} {str(r['launch_real']):>9} | "
              f"{r['padded_us']:>9.1f} {r['ours_us']:>8.1f} {r['padded_us'] / r['ours_us']:>7.2f}x | "
              + (f"{tri_us:>10.1f} {tri_us / r['ours_us']:>6.1f}x" if tri_us else f"{'n/a':>10} {'n/a':>7}")
              + f" | {r['floor_us']:>8.2f} {100 * r['floor_us'] / r['ours_us']:>5.1f}% | {diff:>7.4f}", flush=True)
        del sets, real, sliced
    res = dict(device=torch.cuda.get_device_name(), sms=sms, copy_bw_Bps=bw, torch=torch.__version__, rows=rows,
               time=time.strftime("%Y-%m-%d %H:%M:%S"))
    with open(os.path.join(args.out, "bench_sparse_decode_tp_heads.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
