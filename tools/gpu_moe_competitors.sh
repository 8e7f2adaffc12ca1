#!/usr/bin/env bash
# Ours against SGLang's Marlin MXFP4 MoE runner (issue 59 item 4) on the GPU machine (H200): bench_fp4_moe.py's
# vs-SGLang section (benchmarks/fp4_moe_vs_sglang.py) at 1, 2, 4, ..., 256 tokens x TP shards 1 / 2 / 4 (I = 2048 /
# 1024 / 512), every kernel checked against the float64 reference before it is timed; once natively and once with
# DISABLE_MMA_V3=1 (our Triton parts in SM120's mma.sync class; Marlin is CUDA, one class). FlashInfer's
# flashinfer_mxfp4 paths are attempted too: the SM120 W4A8 kernel reports "cannot run on this GPU", the sm_90 W4A16
# one runs only where FlashInfer's JIT module is built (else it says so).
#
# Needs: the e2e bundle unpacked and prepared (tools/e2e/run_e2e.py --stages fetch,prepare: SGLang 0.5.17,
# sgl-kernel, FlashInfer, tvm-ffi in $DSV4_E2E_SITE (default /tmp/e2e/site), transformers in /tmp/e2e/tf, and
# prebuild_jit.py's modules installed into the tvm-ffi cache, ${TVM_FFI_CACHE_DIR:-~/.cache/tvm-ffi}); our library
# built for sm_90a: build/dsv4 (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh) or /tmp/e2e/dsv4 (prepare's build).
# If a Marlin JIT module is not in the cache, the bench says which and that it would compile (~5 min of nvcc for
# moe_wna16_marlin, tens of seconds for each of the others) and this script stops (exit 3) unless
# DSV4_BENCH_ALLOW_SGLANG_JIT=1 (compile them all here: native pass limit 600 s) or =small (all but moe_wna16_marlin,
# e.g. a .e2e/jit made by the prebuild_jit.py before it built the small modules: limit 240 s).
#
# Usage (repo root): OUT=/some/dir bash tools/gpu_moe_competitors.sh
#   [MMA_SYNC_TOKENS=1,2,...,256] (sizes of the mma.sync pass; default all nine). That pass times ours only: the
#   competitors' times come from the native pass of the same call (the same weights and routing seeds; Marlin and
#   FlashInfer are CUDA, one class), which saves its SGLang import (~20 s) and the weight repacks.
#   [VS_IMPLS=default,cuda_stream_v1,cuda_stream_v3] (our impls in both passes, benchmarks/bench_fp4_moe.py
#   STREAM_IMPLS names: cuda_stream, cuda_stream_v1 ... _v5; default = what our op picks per size; "ours" in the table
#   is then the fastest of them, and a per-impl line gives Marlin / each impl)
#   [USER_BENCH=1] (also `python -m deepseek_v4_kernel bench --ops fp4_moe --quick`, Marlin as its competitor: +~40 s)
# Time: <= 150 s (native pass <= 95 s, mma.sync pass <= 50 s, each killed at its limit; JSON is written per row).
# Writes $OUT/moe_competitors/{native,mma_sync}/{bench_fp4_moe.json,table.md,bench_fp4_moe.png,bench.log} and
# $OUT/moe_competitors/summary.json (both passes, the mma.sync one with the native pass's competitor times).
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the results}
W=${E2E_WORK:-/tmp/e2e}
SITE=${DSV4_E2E_SITE:-$W/site}
R=$OUT/moe_competitors
mkdir -p "$R"
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1
if [ ! -d "$SITE/sglang" ]; then
  echo "gpu_moe_competitors: no SGLang in $SITE: run tools/e2e/run_e2e.py --stages fetch,prepare first"; exit 2
fi
lib=""
for cand in "$PWD/build/dsv4/deepseek_v4_kernel/_C.so" "$W/dsv4/deepseek_v4_kernel/_C.so"; do
  [ -f "$cand" ] && { lib=$cand; break; }
done
if [ -z "$lib" ]; then
  echo "gpu_moe_competitors: no _C.so in build/dsv4 or $W/dsv4: DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh"; exit 2
fi
# SGLang's own modules from the bundle (transformers first, as its servers run); our package from this checkout
# (the bench puts the repo first) with the built library; no sitecustomize: SGLang is not patched in this process.
export DSV4_KERNEL_LIB=$lib PYTHONPATH=$W/tf:$SITE
cache=${TVM_FFI_CACHE_DIR:-$HOME/.cache/tvm-ffi}
n_jit=$(ls "$cache" 2>/dev/null | grep -c sgl_kernel_jit)
echo "library $lib; SGLang from $SITE; tvm-ffi cache $cache: $n_jit module(s)"
ls "$cache" 2>/dev/null | grep -E "marlin|align_single|topk_sum" | sed 's/^/  /'
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
allow=${DSV4_BENCH_ALLOW_SGLANG_JIT:-}
native_limit=95
[ "$allow" = 1 ] && native_limit=600       # compiling Marlin's module takes ~5 min of this call
[ "$allow" = small ] && native_limit=240   # the three small modules: tens of seconds each
vs_impls=${VS_IMPLS:-default}
common=(--vs-only --vs-require marlin --vs-impls "$vs_impls")

t0=$(date +%s)
timeout $native_limit python3 benchmarks/bench_fp4_moe.py --out "$R/native" "${common[@]}" > "$R/native.log" 2>&1
rc1=$?
mkdir -p "$R/native"; mv "$R/native.log" "$R/native/bench.log"
echo "native pass rc=$rc1 ($(( $(date +%s) - t0 )) s)"
grep -E "^vs: |WRONG|failed|Traceback|Error" "$R/native/bench.log" | head -20 | cut -c1-300
if [ $rc1 -eq 3 ]; then
  echo "gpu_moe_competitors: Marlin cannot run here (above); nothing timed. If its JIT modules are missing: run"
  echo "  python3.12 tools/e2e/prebuild_jit.py here and carry .e2e/jit (prepare installs it), or set"
  echo "  DSV4_BENCH_ALLOW_SGLANG_JIT=1 (the first Marlin call then compiles for ~5 min of device time; =small: all"
  echo "  but moe_wna16_marlin)"
  exit 3
fi

mt=${MMA_SYNC_TOKENS:-1,2,4,8,16,32,64,128,256}
t0=$(date +%s)
DISABLE_MMA_V3=1 timeout 50 python3 benchmarks/bench_fp4_moe.py --out "$R/mma_sync" --vs-only --vs "" \
    --vs-tokens "$mt" --vs-impls "$vs_impls" > "$R/mma_sync.log" 2>&1
rc2=$?
mkdir -p "$R/mma_sync"; mv "$R/mma_sync.log" "$R/mma_sync/bench.log"
echo "mma.sync pass rc=$rc2 ($(( $(date +%s) - t0 )) s)"
grep -E "WRONG|failed|Traceback|Error" "$R/mma_sync/bench.log" | head -10 | cut -c1-300

rc3=0
if [ "${USER_BENCH:-}" = 1 ]; then
  t0=$(date +%s)
  timeout 90 python3 -m deepseek_v4_kernel bench --ops fp4_moe --quick --out "$R/user_bench.json" \
      > "$R/user_bench.log" 2>&1
  rc3=$?
  echo "user bench rc=$rc3 ($(( $(date +%s) - t0 )) s)"; tail -12 "$R/user_bench.log" | cut -c1-220
fi

python3 - "$R" <<'EOF'
import json, os, sys
sys.path.insert(0, "benchmarks")
import fp4_moe_vs_sglang as vs
docs = {}
for mode in ("native", "mma_sync"):
    p = os.path.join(sys.argv[1], mode, "bench_fp4_moe.json")
    if os.path.isfile(p) and json.load(open(p)).get("vs_sglang"):
        docs[mode] = json.load(open(p))
    else:
        print(f"=== {mode}: no vs-SGLang result in {p}")
if "mma_sync" in docs and "native" in docs:
    docs["mma_sync"]["vs_sglang"] = vs.with_competitors_of(
        docs["mma_sync"]["vs_sglang"], docs["native"]["vs_sglang"],
        "the native pass of this call (same weights and routing; CUDA kernels, one class)")
json.dump({m: d["vs_sglang"] for m, d in docs.items()}, open(os.path.join(sys.argv[1], "summary.json"), "w"),
          indent=1)
for mode, doc in docs.items():
    res = doc["vs_sglang"]
    print(f"=== {mode}: {doc['device']}, copy {doc['copy_bw_Bps'] / 1e12:.2f} TB/s, {len(res['rows'])} rows, "
          f"{res.get('seconds')} s")
    errs = {}
    for r in res["rows"]:
        for k, e in r["error"].items():
            errs[k] = max(errs.get(k, 0.0), e)
    print("max relative L2 error against the float64 reference (checked before timing): "
          + ", ".join(f"{k} {v:.2e}" for k, v in sorted(errs.items())))
    print(vs.table(res))
    for name in [c["short"] for c in res["competitors"] if c["available"]]:
        s = vs.ratio_summary(res, name)
        if s:
            print(s)
        s = vs.impl_ratios(res, name)
        if s:
            print(s)
EOF
exit $(( rc1 || rc2 || rc3 ))
