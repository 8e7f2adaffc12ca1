#!/usr/bin/env python
"""Ours against every kernel SGLang may run for each op, and DeepSeek's own kernels, in one run on one GPU.

For each op (deepseek_v4_kernel/bench: the shapes, the float64 check before any timing, CUDA-graph timing over
rotated inputs so that caches and weights come from HBM):
  * ours, natively and as SM120 builds it (mma.sync): the second pass re-executes this script in a child with
    DISABLE_MMA_V3=1 (Triton builds mma.sync) and SGLang's TileLang kernels compiled with TL_DISABLE_WGMMA plus
    SGLang's own SM120 settings (bench/competitors.py, bench/sources.py);
  * every runnable competitor (bench/competitors.py): SGLang's TileLang indexer and mHC pre-GEMM kernels of the
    installed SGLang and of the unpacked sources of --sglang-sources (default 0.5.23; DSV4_SGLANG_SOURCES or
    .sglang/sglang-<v>), its Triton and torch fallbacks, FlashInfer's SM120 / CUTLASS paths where they run,
    FlashMLA (sgl_kernel) and DeepGEMM natively (their originals where our patch layer is active);
  * the byte floor (bytes a call must move / copy bandwidth measured here);
  * the hc_prenorm sm_90 rule check: m = 64..2048 at DeepSeek-V4's shape (n 24, K 16384, num_splits None), impl
    "triton", "cuda" and "auto" timed, and which kernel "auto" picked against the fastest.
Writes benchmarks/results/bench_competitors.json (+ .png where matplotlib imports) and prints the tables.

usage: python benchmarks/bench_competitors.py [--tp N] [--ops a,b] [--full] [--no-mma-sync] [--allow-jit]
                                              [--sglang-sources 0.5.23[,...]] [--out DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from deepseek_v4_kernel.bench import cli, shapes  # noqa: E402

HC_RULE_M = (64, 128, 256, 512, 1024, 2048)


def log(msg, t0=[time.time()]):  # noqa: B006  (the run's start)
    print(f"[bench_competitors {time.time() - t0[0]:6.1f}s] {msg}", file=sys.stderr, flush=True)


def hc_rule_check(pools):
    """hc_prenorm impl triton / cuda / auto at m = 64..2048, num_splits None: does auto pick the fastest?"""
    import torch

    from deepseek_v4_kernel.bench import inputs
    from deepseek_v4_kernel.bench.timing import time_rotated
    from deepseek_v4_kernel.ops.hc_prenorm import dispatch, hc_prenorm_gemm
    from deepseek_v4_kernel.patch.measured import size_class

    rows = []
    for m in HC_RULE_M:
        case = shapes.Case("hc_prenorm", m, size_class("hc_prenorm", m), (("splits", None),))
        sets = inputs.hc_prenorm_sets(case, pools)
        check = inputs.check_rows(m)
        ref = inputs.hc_prenorm_reference(sets[0], check)
        row = {"m": m, "picked": dispatch.pick_impl(sets[0]["x"], sets[0]["fn"], 1, "auto")}
        for impl in ("triton", "cuda", "auto"):
            calls = [lambda a=a, impl=impl: hc_prenorm_gemm(a["x"], a["fn"], a["out"], a["sqrsum"], None, impl=impl)
                     for a in sets]
            try:
                calls[0]()
                torch.cuda.synchronize()
                err = inputs.rel_error("hc_prenorm", (sets[0]["out"], sets[0]["sqrsum"]), ref, sets[0], check)
                if not err <= inputs.TOLERANCE["hc_prenorm"]:
                    row[impl] = {"status": "wrong", "error": err}
                    continue
                us, how = time_rotated(calls)
                row[impl] = {"status": "ok", "us": us, "how": how, "error": err}
            except Exception as e:  # noqa: BLE001
                row[impl] = {"status": "failed", "reason": f"{type(e).__name__}: {str(e)[:160]}"}
        timed = {i: row[i]["us"] for i in ("triton", "cuda") if row[i].get("status") == "ok"}
        row["fastest"] = min(timed, key=timed.get) if timed else None
        row["auto_is_fastest"] = row["fastest"] is not None and row["picked"] == row["fastest"]
        rows.append(row)
        log(f"hc rule m={m}: " + ", ".join(f"{i} {row[i].get('us', float('nan')):.1f} us" for i in
                                            ("triton", "cuda", "auto")) + f"; auto picked {row['picked']}, "
            f"fastest {row['fastest']}" + ("" if row["auto_is_fastest"] else "  <-- auto is NOT the fastest"))
    return rows


def hc_rule_table(rows):
    lines = [f"{'m':>6}  {'triton us':>10}  {'cuda us':>8}  {'auto us':>8}  auto picked  fastest  ok"]
    for r in rows:
        cell = lambda i: f"{r[i]['us']:.1f}" if r[i].get("status") == "ok" else r[i].get("status")  # noqa: E731
        lines.append(f"{r['m']:>6}  {cell('triton'):>10}  {cell('cuda'):>8}  {cell('auto'):>8}  {r['picked']:<11}  "
                     f"{str(r['fastest']):<7}  {'yes' if r['auto_is_fastest'] else 'NO'}")
    return "\n".join(lines)


def plot(docs, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log(f"no plot: {e}")
        return None
    ops = list(next(iter(docs.values()))["ops"])
    fig, axes = plt.subplots(len(ops), 1, figsize=(14, 4.2 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        series = {}
        labels = None
        for mode, doc in docs.items():
            rows = doc["ops"][op]["rows"]
            labels = [r["label"] for r in rows]
            for r in rows:
                for name, res in r["results"].items():
                    key = f"{name} [{mode}]" if name.startswith("ours") or "tilelang" in name else name
                    series.setdefault(key, {})[r["label"]] = res.get("us") if res.get("status") == "ok" else None
            series.setdefault("byte floor", {}).update({r["label"]: r.get("floor_us") for r in rows})
        n = len(series)
        width = 0.8 / max(n, 1)
        for i, (name, vals) in enumerate(sorted(series.items())):
            xs = [j + i * width for j in range(len(labels))]
            ax.bar(xs, [vals.get(lbl) or 0 for lbl in labels], width, label=name[:70])
        ax.set_xticks([j + 0.4 for j in range(len(labels))])
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("µs per call")
        ax.set_title(op)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ops", default=",".join(shapes.OPS))
    ap.add_argument("--full", action="store_true", help="the full grid (default: the quick grid, < 4 min on an H200)")
    ap.add_argument("--no-mma-sync", action="store_true", help="skip the mma.sync (SM120 instruction class) pass")
    ap.add_argument("--allow-jit", action="store_true", help="let FlashInfer JIT-compile its MoE module (minutes)")
    ap.add_argument("--sglang-sources", default="0.5.23")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--child-mma-sync", default=None, help=argparse.SUPPRESS)   # the re-executed pass: its JSON path
    args = ap.parse_args()
    argv = ["--tp", str(args.tp), "--ops", args.ops, "--floor", "--sglang-sources", args.sglang_sources]
    argv += [] if args.full else ["--quick"]
    argv += ["--allow-jit"] if args.allow_jit else []
    try:
        opts = cli.parse_args(argv + (["--mma-sync"] if args.child_mma_sync else []))
    except cli.UsageError as e:
        ap.error(str(e))
    if args.child_mma_sync:
        doc = cli.run(opts, log=lambda m: log("[mma.sync] " + m))
        with open(args.child_mma_sync, "w") as f:
            json.dump(doc, f)
        return 0
    t0 = time.time()
    opts["hc_impls"] = ("triton", "cuda")
    docs = {"native": cli.run(opts, log=log)}
    result = {"native": docs["native"]}
    if "hc_prenorm" in opts["ops"]:
        import torch

        from deepseek_v4_kernel.bench.inputs import Pools
        from deepseek_v4_kernel.bench.timing import l2_bytes

        result["hc_rule_sm90"] = hc_rule_check(Pools(torch.device("cuda"), l2_bytes()))
    if not args.no_mma_sync:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "mma_sync.json")
            env = dict(os.environ, DISABLE_MMA_V3="1")
            log("mma.sync pass: re-running in a child with DISABLE_MMA_V3=1 and TileLang's TL_DISABLE_WGMMA")
            r = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--child-mma-sync", path],
                               env=env)
            if r.returncode == 0 and os.path.exists(path):
                docs["mma_sync"] = result["mma_sync"] = json.load(open(path))
            else:
                result["mma_sync_error"] = f"child exited with {r.returncode}"
                log(result["mma_sync_error"])
    from deepseek_v4_kernel.bench import report

    for mode, doc in docs.items():
        print(f"=== {mode}: {doc['gpu']['name']} sm_{doc['gpu']['capability'][0]}{doc['gpu']['capability'][1]}, "
              f"TP {doc['tp']} ===")
        print(report.table(doc))
    if "hc_rule_sm90" in result:
        print("=== hc_prenorm auto rule (n 24, K 16384, num_splits None; native class) ===")
        print(hc_rule_table(result["hc_rule_sm90"]))
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, "bench_competitors.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    png = plot(docs, os.path.join(args.out, "bench_competitors.png"))
    log(f"wrote {out}" + (f" and {png}" if png else "") + f" in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
