#!/usr/bin/env bash
# The competitor benchmark and the user bench on the GPU machine (not SM12x: the H200 of the device machine), with
# SGLang's kernels from the end-to-end bundle that tools/e2e/run_e2e.py unpacked there (SGLang 0.5.17, TileLang,
# sgl-kernel's FlashMLA, DeepGEMM) and SGLang 0.5.23's kernel sources from .e2e/sgl-src (carried; see
# docs/development.md). Our library: the one run_e2e.py's prepare built (sm_120a + sm_90a), else built here.
# Usage (repo root): OUT=/some/dir [E2E_WORK=/tmp/e2e] bash tools/gpu_bench.sh [--tp N] [bench_competitors options]
# The competitor bench runs its full grid (every size-class point the keep rules of patch/measured.py rest on; the
# quick grid took ~2 min on an H200 with both instruction classes, the hc_prenorm full grid alone ~1.7 min).
# Writes $OUT/bench_competitors.{json,png,log} and $OUT/user_bench.{json,log}.
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the results}
W=${E2E_WORK:-/tmp/e2e}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1
lib=$W/dsv4/deepseek_v4_kernel/_C.so
if [ ! -f "$lib" ]; then
  lib=$PWD/build/bench/_C.so
  DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build_ext.sh "$lib" > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
fi
[ -d "$W/site/tilelang" ] || echo "gpu_bench: no TileLang in $W/site: SGLang's TileLang kernels are left out"
export DSV4_KERNEL_LIB=$lib PYTHONPATH=$W/tf:$W/site DSV4_SGLANG_SOURCES=$PWD/.e2e/sgl-src
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
( time python3 benchmarks/bench_competitors.py --full --out "$OUT" "$@" ) > "$OUT/bench_competitors.log" 2>&1
rc1=$?
echo "bench_competitors rc=$rc1"; tail -60 "$OUT/bench_competitors.log" | cut -c1-220
( time python3 -m deepseek_v4_kernel bench --out "$OUT/user_bench.json" ) > "$OUT/user_bench.log" 2>&1
rc2=$?
echo "user bench rc=$rc2"; tail -40 "$OUT/user_bench.log" | cut -c1-220
exit $(( rc1 || rc2 ))
