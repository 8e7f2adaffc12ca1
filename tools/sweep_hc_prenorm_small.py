"""The mHC pre-GEMM at decode sizes with SGLang's mhc_pre split count, ours against SGLang's TileLang kernels in the
same run: what "auto" runs, each few-rows kernel launch (rows per block R, fn rows over one, three or six blocks:
params small_rows / fn_groups), and every runnable competitor (TileLang split-K / one split of the SGLang sources
given, torch, DeepGEMM). The data behind hc_prenorm.dispatch.FN_GROUPS_RULE and the class-edge rows of
docs/hc_prenorm.md section 4.10. Every variant is checked against float64 first (bench/runner.measure).

  DSV4_KERNEL_FORCE=1 python3 tools/sweep_hc_prenorm_small.py --ms 1,2,3,4,6,8,12,16,24,32 --mma-sync --out DIR
  (--mma-sync: SGLang's TileLang kernels compiled as SM120 builds them, and Triton with DISABLE_MMA_V3=1; the
  few-rows kernel is FMA-only, the same in both classes. DSV4_SGLANG_SOURCES or .sglang/sglang-<v> holds the sources.)
Writes DIR/sweep_hc_prenorm_small.json and prints one table.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SMALL_VARIANTS = [(f"R{r}", {"small_rows": r, "fn_groups": 1}) for r in (1, 2, 4, 8, 16)] + \
                 [(f"R{r}/fg{g}", {"small_rows": r, "fn_groups": g}) for g in (3, 6) for r in (2, 4, 8)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms", default="1,2,3,4,6,8,12,16,24,32")
    ap.add_argument("--mma-sync", action="store_true")
    ap.add_argument("--sglang-sources", default="0.5.23")
    ap.add_argument("--variants-max-m", type=int, default=32, help="time the few-rows launches up to this m")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    if args.mma_sync:
        os.environ["DISABLE_MMA_V3"] = "1"   # before Triton builds anything
    import torch

    from deepseek_v4_kernel.bench import inputs, runner, shapes
    from deepseek_v4_kernel.bench.timing import l2_bytes
    from deepseek_v4_kernel.ops import hc_prenorm as hp
    from deepseek_v4_kernel.bench import competitors as comp
    from deepseek_v4_kernel.patch.measured import size_class

    dev = torch.device("cuda")
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    versions = tuple(v for v in args.sglang_sources.split(",") if v)
    found = comp.discover("hc_prenorm", mma_sync=args.mma_sync, source_versions=versions)
    for c in found:
        print(f"competitor {c.name}: {'runs' if c.runnable else c.same_as or c.reason}", file=sys.stderr)
    runnable = [c for c in found if c.runnable]
    pools = inputs.Pools(dev, l2_bytes(dev))
    rows = []
    t0 = time.time()
    for m in [int(v) for v in args.ms.split(",") if v]:
        S = shapes.sglang_mhc_splits(m, num_sms)
        case = shapes.Case("hc_prenorm", m, size_class("hc_prenorm", m), (("splits", S),))
        sets = inputs.hc_prenorm_sets(case, pools)
        check = inputs.check_rows(m)
        ref = inputs.hc_prenorm_reference(sets[0], check)
        row = {"m": m, "splits": S, "class": case.size_class, "results": {}}
        res = runner.measure("hc_prenorm", "ours", runner.ours_prepare("hc_prenorm"), sets, ref, check)
        res["launch"] = [hp.api.last_launch, hp.api.last_fn_groups]
        row["results"]["ours auto"] = res
        if m <= args.variants_max_m:
            for label, cfg in SMALL_VARIANTS:
                def prepare(a, cfg=cfg):
                    def call():
                        hp.hc_prenorm_gemm(a["x"], a["fn"], a["out"], a["sqrsum"], a["num_splits"], impl="cuda",
                                           _config=cfg)
                        return a["out"], a["sqrsum"]
                    return call
                row["results"][f"ours {label}"] = runner.measure("hc_prenorm", label, prepare, sets, ref, check)
        for c in runnable:
            row["results"][c.name] = runner.measure("hc_prenorm", c.name, c.prepare, sets, ref, check)
        rows.append(row)
        del sets
        ok = {k: v["us"] for k, v in row["results"].items() if v.get("status") == "ok"}
        tl = {k: v for k, v in ok.items() if "tilelang" in k}
        ours = {k: v for k, v in ok.items() if k.startswith("ours")}
        best = min(ours, key=ours.get) if ours else None
        tl_best = min(tl, key=tl.get) if tl else None
        row["ours_best"], row["tilelang_best"] = best, tl_best
        line = f"m {m:5d} S {S:3d}: ours auto {ok.get('ours auto', float('nan')):6.2f} us ({res['launch']})"
        if best:
            line += f", best ours {best} {ours[best]:.2f}"
        if tl_best:
            line += f", TileLang {tl[tl_best]:.2f} ({tl_best.split(' (')[0]}): auto x{tl[tl_best] / ok['ours auto']:.2f}" \
                if "ours auto" in ok else ""
        print(line, flush=True)
    names = sorted({k for r in rows for k in r["results"]})
    print("\n| m | S | " + " | ".join(n.replace("sglang-", "")[:40] for n in names) + " |")
    print("|---" * (len(names) + 2) + "|")
    for r in rows:
        cells = [f"{r['results'][n]['us']:.2f}" if r["results"].get(n, {}).get("status") == "ok"
                 else r["results"].get(n, {}).get("status", "-") for n in names]
        print(f"| {r['m']} | {r['splits']} | " + " | ".join(cells) + " |")
    doc = {"gpu": torch.cuda.get_device_name(dev), "sms": num_sms, "mma_sync": args.mma_sync,
           "torch": torch.__version__, "sglang_sources": versions, "seconds": round(time.time() - t0, 1),
           "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "sweep_hc_prenorm_small.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
