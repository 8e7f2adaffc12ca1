"""Sweep of the compiled MMA kernel's x rows per block (16 / 32 / 64: csrc/hc_prenorm/kernel.cuh kR, params mma_rows)
and sub-slice counts P at decode sizes, against what "auto" takes and torch fp32 (the issue's competitor), with
num_splits None (sub-slices added by atomics) and SGLang's mhc_pre split count (no sub-slices). The data behind
hc_prenorm.mma_rows_pick (H100, docs/hc_prenorm.md); rerun it on an SM120 card to refit the rule there.
Every variant is checked against float64 first, on poisoned outputs.

  python tools/sweep_hc_prenorm_rows.py --ms 16,32,48,64,96,128 --rows 16,32,64 --ps 16,32,64 --out DIR
  (--fixed-order adds the sub-slices summed by the reduce grid: DSV4_HC_PRENORM_ATOMIC=0's path)
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402

import bench_hc_prenorm as b  # noqa: E402
from deepseek_v4_kernel.ops import hc_prenorm as hp  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms", default="16,24,32,40,48,56,63,64,96,128")
    ap.add_argument("--rows", default="16,32,64")
    ap.add_argument("--ps", default="16,32,64")
    ap.add_argument("--fixed-order", action="store_true")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    ints = lambda s: [int(v) for v in s.split(",") if v]
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = []
    for m in ints(args.ms):
        for S_arg in (None, b.sglang_num_splits(m, n_sms)):
            S = S_arg or 1
            sets, _ = b.make_sets(m, S)
            if S_arg is None:   # 2-D out / sqrsum, as SGLang's hc_pre passes them
                sets = [(x, fn, o[0], q[0]) for x, fn, o, q in sets]
            x, fn, o, q = sets[0]
            ref = b._reference(x, fn)
            t_torch = b.time_graph([lambda s=s: b.torch_fp32(s) for s in sets], args.reps)
            variants = [("auto", "auto", None)]
            for R in ints(args.rows):
                if R > m:
                    continue
                if S_arg is not None:
                    variants.append((f"rows={R} S", "cuda", {"p": 1, "mma_rows": R}))
                    continue
                for P in ints(args.ps):
                    variants.append((f"rows={R} P={P}", "cuda", {"p": P, "mma_rows": R, "atomic": True}))
                    if args.fixed_order:
                        variants.append((f"rows={R} P={P} fixed", "cuda", {"p": P, "mma_rows": R, "atomic": False}))
            tag = "None" if S_arg is None else str(S)
            for label, impl, cfg in variants:
                o.fill_(float("nan"))
                q.fill_(float("nan"))
                hp.hc_prenorm_gemm(x, fn, o, q, S_arg, impl=impl, _config=cfg)
                launch = hp.api.last_launch
                err, sq_err = b._errors(o, q, S, m, ref)
                ok = err <= 2.0 ** -13 and sq_err <= 2e-5
                t = b.time_graph([lambda s=s: hp.hc_prenorm_gemm(s[0], s[1], s[2], s[3], S_arg, impl=impl,
                                                                 _config=cfg) for s in sets], args.reps)
                res.append(dict(m=m, S=tag, variant=label, us=t, x_torch=t_torch / t, torch_us=t_torch, err=err,
                                sq_err=sq_err, ok=ok, launch=str(launch)))
                print(f"{m:4d} {tag:>4} {label:>18} {t:7.2f} us {t_torch / t:5.2f}x  {'ok' if ok else 'FAIL'} "
                      f"err {err:.1e} sq {sq_err:.1e} {launch}", flush=True)
            print(f"{m:4d} {tag:>4} {'torch fp32':>18} {t_torch:7.2f}", flush=True)
            del sets, ref
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sweep_hc_prenorm_rows.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(0), n_sms=n_sms, rows=res), f, indent=1)


if __name__ == "__main__":
    main()
