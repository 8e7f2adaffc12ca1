#!/usr/bin/env bash
# fp4_moe on the GPU machine (H200): the compiled decode kernels' GPU tests, then the MoE bench of our impls at
# 1-256 tokens for I = 2048 and its TP-2 shard 1024, printing per size: us, % of the weight-bytes floor, ratio to the
# two-launch kernels (cuda_decode). Bounded: ~150 s (pytest <= 75 s, benches <= 95 s, each under a timeout).
#   OUT=/some/dir bash tools/gpu_fp4_moe.sh          (repo root; the library from build/dsv4, as
#                                                     DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh leaves it)
# Impls timed (benchmarks/bench_fp4_moe.py --impls): cuda_decode (the two-launch kernels), cuda_stream (the
# streaming kernels, default variant and rule), cuda_stream_v1 (variant 1: 2 ring steps, 4 blocks per SM),
# cuda_stream_w4 (4 warps per item at every size), and Triton's dequant in SM120's instruction class
# (DISABLE_MMA_V3=1; it changes nothing for the CUDA kernels, which use mma.sync on every GPU); native Triton
# dequant at 1 / 8 / 32 / 256 tokens if time is left. Writes $OUT/fp4_moe/{pytest.log,pytest.xml,
# i2048/,i1024/,native/,summary.json}.
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
timeout 75 python3 -m pytest -q -rs tests/test_fp4_moe.py -p no:cacheprovider --durations=8 \
    -k "stream or cuda_decode_routing or scale_range or (graph_capture_replay and (default or cuda_decode))" \
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
STREAM=cuda_decode,cuda_stream,cuda_stream_v1,cuda_stream_w4
DISABLE_MMA_V3=1 bench i2048 60 --inter 2048 --impls $STREAM,dequant
DISABLE_MMA_V3=1 bench i1024 35 --inter 1024 --impls $STREAM
TOK=1,8,32,256 bench native 30 --inter 2048 --impls dequant

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
summary = {}
for name in ("i2048", "i1024", "native"):
    f = os.path.join(out, name, "bench_fp4_moe.json")
    if not os.path.exists(f):
        print(f"{name}: no results"); continue
    r = json.load(open(f))
    summary[name] = r
    impls = list(dict.fromkeys(k[:-3] for row in r["rows"] for k in row if k.endswith("_us") and not k.endswith(
        ("floor_us", "eager_us", "scales_us", "best_us"))))
    print(f"\n{name}: {r['device']}, copy {r['copy_bw_Bps'] / 1e12:.2f} TB/s, I={r['I']}; spot check {r['check']}")
    print("tokens experts floor_us | " + " | ".join(f"{i} us (% floor)" for i in impls)
          + " | stream/decode | best stream/decode | f32-scale % floor (stream)")
    for row in r["rows"]:
        fl = row["weight_floor_us"]
        cells = [f"{row[f'{i}_us']:.1f} ({100 * fl / row[f'{i}_us']:.0f}%)" if f"{i}_us" in row else "-" for i in impls]
        dec = row.get("cuda_decode_us")
        st = [row[k] for k in ("cuda_stream_us", "cuda_stream_v1_us", "cuda_stream_w4_us") if k in row]
        ratio = f"{dec / row['cuda_stream_us']:.2f}x" if dec and "cuda_stream_us" in row else "-"
        best = f"{dec / min(st):.2f}x" if dec and st else "-"
        f32 = (f"{100 * row['weight_floor_f32_scales_us'] / row['cuda_stream_f32_scales_us']:.0f}%"
               if "cuda_stream_f32_scales_us" in row else "-")
        print(f"{row['tokens']:6d} {row['experts_hit']:7d} {fl:8.1f} | " + " | ".join(cells)
              + f" | {ratio} | {best} | {f32}")
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
PY
echo "gpu_fp4_moe: $(( $(date +%s) - t_start )) s total"
exit $rc_test
