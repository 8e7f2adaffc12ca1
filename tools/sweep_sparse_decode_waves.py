#!/usr/bin/env python
"""Batches beyond one wave of blocks: one call against the batch cut into two calls (ops/sparse_decode.batch_parts),
timed (a benchmark script: prints a table, writes JSON; never a test).

  python3 tools/sweep_sparse_decode_waves.py [--rounds 2] [--reps 15] [--quick] [--out F.json]

Per shape (b, h_q, s_q, extra): the op as one call (waves=False) and with each cut batch_parts considers (the first
rows in whole waves of unsplit 64-head blocks, the second call under one or between one and two waves' rows), each
cut forced, all in one process with the bench's method (benchmarks/bench_sparse_decode.py: decode-step inputs, KV rows
from HBM, q and indices hot, CUDA graphs of >= 1 ms, median of --reps), --rounds times over in turn; per point the
minimum over rounds. The table gives the ratio of each cut to one call, the model's ratio for it (mma64_cost summed
over the parts against one call's) and which cut the shipped rule takes ("-": none), so the rule's threshold
(WAVE_CUT_GAIN) can be checked against the measured ratios on the card at hand. --separator puts a one-element
torch kernel after every call (its time, measured alone, subtracted): the op between other kernels, as a decode step
calls it, rather than back to back with itself, where PDL lets the next call's grid overlap this one's last kernel.
"""
import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_sparse_decode as B  # noqa: E402
import deepseek_v4_kernel.ops.sparse_decode as sd  # noqa: E402


def shapes(num_sms, quick):
    """(b, h_q, s_q, extra): a few rows past one and two waves of 64-head blocks, for 64 / 128 / 16 heads."""
    out = []
    for h_q, s_q in ((64, 1), (128, 1), (64, 2), (16, 1)):
        per = num_sms // (s_q * -(-h_q // 64))
        bs = [per + 1, per + 8, per + per // 4, per + per // 2, 2 * per - per // 8, 2 * per + 8]
        if quick:
            bs = [per + 1, per + 8, per + per // 2]
        for extra in ((512, 2048) if (h_q, s_q) == (64, 1) else (512,)):
            out += [(b, h_q, s_q, extra) for b in bs]
    return out


def model_ratio(b, b1, h_q, s_q, T, num_sms):
    """The launch model's time of the cut at b1 (both parts) over that of one launch."""
    return (sd.model_cost(b1, s_q, h_q, T, num_sms) + sd.model_cost(b - b1, s_q, h_q, T, num_sms)) / \
        sd.model_cost(b, s_q, h_q, T, num_sms)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="three b per head count")
    ap.add_argument("--separator", action="store_true",
                    help="a one-element torch kernel (a plain launch) after every call, its own time subtracted: a "
                         "call between other kernels, as in a decode step, instead of back to back with itself")
    ap.add_argument("--parts", action="store_true", help="also time each cut's two parts as calls of their own")
    ap.add_argument("--out", help="JSON file")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("sweep_sparse_decode_waves: needs a CUDA device")
    dev = torch.device("cuda")
    num_sms = sd._sm_count(dev)
    inp = B.DecodeInputs(torch.Generator(device="cuda").manual_seed(0))
    orig = sd.batch_parts
    sep = torch.zeros(1, device=dev)
    sep_us = 0.0
    if a.separator:
        sep_us = min(B.time_fn(lambda x: sep.add_(1.0), [None] * 4, a.reps)[0] for _ in range(a.rounds))
        print(f"separator kernel alone: {sep_us:.2f} us per call (subtracted below)", flush=True)

    def call(x):
        sd.sparse_decode(**x)
        if a.separator:
            sep.add_(1.0)
    rows = []
    for (b, h_q, s_q, extra) in shapes(num_sms, a.quick):
        T = 128 + extra
        sets = inp.sets(b, h_q, s_q, extra)
        points = {"one": None}
        for b1 in sorted(sd.wave_cut_candidates(b, s_q, h_q, num_sms), reverse=True):   # the larger cut first
            points[f"cut {b1}"] = b1
        best = {}
        for _ in range(a.rounds):
            for name, b1 in points.items():
                sd.batch_parts = (lambda *args, b1=b1, **kw: (b1,)) if b1 else (lambda *args, **kw: ())
                try:
                    t = B.time_fn(call, sets, a.reps)[0] - sep_us
                finally:
                    sd.batch_parts = orig
                best[name] = min(best.get(name, t), t)
        alone = {}
        if a.parts:   # each part as a call of its own (own input sets), the same method
            for n in sorted({x for b1 in points.values() if b1 for x in (b1, b - b1)}):
                psets = inp.sets(n, h_q, s_q, extra)
                alone[n] = min(B.time_fn(call, psets, a.reps)[0] - sep_us for _ in range(a.rounds))
                del psets
        rule = orig(b, s_q, h_q, T, num_sms)
        row = dict(b=b, h_q=h_q, s_q=s_q, extra=extra, rule_cut=rule[0] if rule else None, us=best, parts_alone=alone,
                   model={n: model_ratio(b, b1, h_q, s_q, T, num_sms) for n, b1 in points.items() if b1})
        rows.append(row)
        cells = "  ".join(f"{n} {best[n]:8.2f} ({best[n] / best['one']:.3f}, model {row['model'][n]:.3f})"
                          for n in points if n != "one")
        if alone:
            cells += "  alone: " + ", ".join(f"b={n} {t:.2f}" for n, t in alone.items())
        print(f"b={b:4d} h_q={h_q:3d} s_q={s_q} extra={extra:4d}  rule {rule[0] if rule else '-':>4}  "
              f"one {best['one']:8.2f} us  {cells}", flush=True)
        del sets
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(dev), num_sms=num_sms, gain=sd.WAVE_CUT_GAIN,
                           rounds=a.rounds, reps=a.reps, separator_us=sep_us if a.separator else None, rows=rows),
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
