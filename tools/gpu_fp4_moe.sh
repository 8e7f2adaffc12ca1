#!/usr/bin/env bash
# fp4_moe on the GPU machine (H200): the GPU tests of the streaming kernels' variants (0-5) and of the
# bench-only diagnostics, then the MoE bench at 1-256 tokens for I = 2048 (and its TP-2 shard 1024 if time is left),
# printing per size: us and % of the weight-bytes floor per impl, and the diagnostics' ceilings at 1 / 8 / 32 / 128
# tokens. Bounded: <= 150 s (pytest <= 60 s, benches <= 85 s, each under a timeout and the script's budget).
#   OUT=/some/dir bash tools/gpu_fp4_moe.sh          (repo root; the library from build/dsv4, as
#                                                     DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh leaves it)
# Impls timed (benchmarks/bench_fp4_moe.py --impls; ops/fp4_moe/dispatch.py STREAM_VARIANTS):
#   cuda_stream (default variant 0: 3 register ring steps, 3 blocks/SM), cuda_stream_v1 (2 steps, 4 blocks/SM),
#   cuda_stream_v2 / _v3 (cp.async shared-memory ring: 4 stages at 3 blocks/SM, 3 at 4 blocks/SM),
#   cuda_stream_v4 / _v5 (variants 0 / 3 with two MMA chains per tile);
#   diagnostics (wrong results by design): cuda_stream_diag_loads_v{0,1,3} (the weight stream of that variant, decode +
#   MMA replaced by an XOR fold: its memory-side ceiling), cuda_stream_diag_compute_v{0,1} (decode + MMA on weights
#   loaded once: the compute-side ceiling). Writes $OUT/fp4_moe/{pytest.log,pytest.xml,i2048/,diag/,i1024/,
#   summary.json}.
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the results}/fp4_moe
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 PYTHONPATH=$PWD/build/dsv4${PYTHONPATH:+:$PYTHONPATH}
export DSV4_KERNEL_LIB=${DSV4_KERNEL_LIB:-$PWD/build/dsv4/deepseek_v4_kernel/_C.so}
t_start=$(date +%s)
left() { echo $(( 150 - ($(date +%s) - t_start) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/env.txt"
python3 - <<'PY' || { echo "gpu_fp4_moe: $DSV4_KERNEL_LIB lacks the streaming kernels (rebuild: scripts/build.sh)"; exit 1; }
from deepseek_v4_kernel._ext import has_fp4_moe_stream, built_archs
assert has_fp4_moe_stream(), "no dsv4_fp4_moe_stream"
print("library archs", built_archs())
PY

t0=$(date +%s)
timeout 60 python3 -m pytest -q -rs tests/test_fp4_moe_stream.py tests/test_fp4_moe_gpu.py -p no:cacheprovider \
    --durations=8 -k "stream or cuda_decode_routing or scale_range or (graph_capture_replay and default)" \
    --junitxml="$OUT/pytest.xml" > "$OUT/pytest.log" 2>&1
rc_test=$?
echo "pytest rc=$rc_test ($(( $(date +%s) - t0 )) s)"; tail -25 "$OUT/pytest.log" | cut -c1-200

TOK=1,2,4,8,16,32,64,128,256
bench() {   # name, timeout, extra args...
    local name=$1 lim=$2; shift 2
    local t0; t0=$(date +%s)
    [ "$lim" -gt "$(left)" ] && lim=$(left)
    [ "$lim" -lt 10 ] && { echo "bench $name: skipped (time budget)"; return 0; }
    timeout "$lim" python3 benchmarks/bench_fp4_moe.py --out "$OUT/$name" --no-baselines --tokens $TOK "$@" \
        > "$OUT/$name.log" 2>&1
    echo "bench $name rc=$? ($(( $(date +%s) - t0 )) s)"
}
STREAM=cuda_stream,cuda_stream_v1,cuda_stream_v2,cuda_stream_v3,cuda_stream_v4,cuda_stream_v5
DIAG=cuda_stream_diag_loads_v0,cuda_stream_diag_loads_v1,cuda_stream_diag_loads_v3
DIAG=$DIAG,cuda_stream_diag_compute_v0,cuda_stream_diag_compute_v1
bench i2048 40 --inter 2048 --impls $STREAM
TOK=1,8,32,128 bench diag 25 --inter 2048 --impls cuda_stream,cuda_stream_v1,cuda_stream_v3,$DIAG
bench i1024 30 --inter 1024 --impls $STREAM

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
summary = {}
for name in ("i2048", "diag", "i1024"):
    f = os.path.join(out, name, "bench_fp4_moe.json")
    if not os.path.exists(f):
        print(f"{name}: no results"); continue
    r = json.load(open(f))
    summary[name] = r
    impls = list(dict.fromkeys(k[:-3] for row in r["rows"] for k in row if k.endswith("_us") and not k.endswith(
        ("floor_us", "eager_us", "scales_us", "best_us"))))
    short = [i.replace("cuda_stream_diag_", "d_").replace("cuda_stream", "st") for i in impls]
    print(f"\n{name}: {r['device']}, copy {r['copy_bw_Bps'] / 1e12:.2f} TB/s, I={r['I']}; spot check "
          + ", ".join(f"{k} {v:.1e}" for k, v in r["check"].items() if isinstance(v, float)))
    print("tokens floor_us | " + " | ".join(f"{i:>14s}" for i in short) + " | best (x cuda_stream)")
    for row in r["rows"]:
        fl = row["weight_floor_us"]
        cells = [f"{row[f'{i}_us']:7.1f} ({100 * fl / row[f'{i}_us']:2.0f}%)" if f"{i}_us" in row else
                 f"{'-':>14s}" for i in impls]
        best = row.get("best_impl", "-")
        ratio = (f"{row['cuda_stream_us'] / row['best_us']:.2f}x" if "cuda_stream_us" in row and "best_us" in row
                 else "-")
        print(f"{row['tokens']:6d} {fl:8.1f} | " + " | ".join(cells) + f" | {best} ({ratio})")
        errs = [k[:-6] for k in row if k.endswith("_error")]
        if errs:
            print("        failed: " + "; ".join(f"{k}: {row[k + '_error'][:120]}" for k in errs))
if "diag" in summary:
    print("\ndiagnostics (% of the weight floor): loads-only = the memory-side ceiling of that load scheme, "
          "compute-only = the compute-side ceiling; the real kernel sits near the lower of the two if it is one "
          "limiter")
    for row in summary["diag"]["rows"]:
        fl = row["weight_floor_us"]
        pct = lambda i: f"{100 * fl / row[i + '_us']:.0f}%" if i + "_us" in row else "-"
        print(f"  {row['tokens']:4d} tokens: v0 {pct('cuda_stream')} (loads {pct('cuda_stream_diag_loads_v0')}, "
              f"compute {pct('cuda_stream_diag_compute_v0')}); v1 {pct('cuda_stream_v1')} (loads "
              f"{pct('cuda_stream_diag_loads_v1')}, compute {pct('cuda_stream_diag_compute_v1')}); v3 "
              f"{pct('cuda_stream_v3')} (loads {pct('cuda_stream_diag_loads_v3')})")
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
PY
echo "gpu_fp4_moe: $(( $(date +%s) - t_start )) s total"
exit $rc_test
