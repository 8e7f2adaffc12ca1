#!/usr/bin/env bash
# sgl-deep-gemm's SM120 mHC pre-norm GEMM on the H200 (sm_90a), timed against ours (issue 62 item 3). About 60 s:
# tools/deepgemm_sm120.py copies the e2e bundle's sgl-deep-gemm headers ($DSV4_E2E_SITE/deep_gemm/include, default
# /tmp/e2e/site) into a temporary directory, relaxes their __CUDA_ARCH__ >= 1200 guards there, builds our host code
# for sm_90a (~20-30 s of nvcc), checks both kernels against float64 and times them at m 1 / 8 / 64 / 256 with
# num_splits 1 and SGLang's split count. The indexer kernel is compiled only (see the tool's docstring for why).
# Usage (repo root, library built with DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh): OUT=dir bash tools/gpu_deepgemm_sm120.sh
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the results}
R=$OUT/deepgemm_sm120
mkdir -p "$R"
SITE=${DSV4_E2E_SITE:-/tmp/e2e/site}
INC=$SITE/deep_gemm/include
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 PYTHONPATH=build/dsv4:${PYTHONPATH:-}
[ -d "$INC" ] || { echo "gpu_deepgemm_sm120: no $INC (the e2e bundle's sgl-deep-gemm)"; exit 1; }
cat "$SITE"/sgl_deep_gemm-*.dist-info/METADATA 2>/dev/null | grep -m1 '^Version' || true
timeout 85 python3 tools/deepgemm_sm120.py --include "$INC" --out "$R/deepgemm_sm120.json" > "$R/run.log" 2>&1
rc=$?
grep -v '^ptxas\|^    0 bytes' "$R/run.log" | tail -25 | cut -c1-250
python3 - "$R/deepgemm_sm120.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("no result:", e); sys.exit(0)
print("\n| m | splits | DeepGEMM SM120 us | ours us | DeepGEMM / ours | DeepGEMM err | ours err |")
print("|---|---|---|---|---|---|---|")
for r in d.get("hc_prenorm", []):
    a, b = r.get("deepgemm_sm120", {}), r.get("ours", {})
    cell = lambda x: x.get("us", x.get("status")) if x else "-"
    print(f"| {r['m']} | {r['splits']} | {cell(a)} | {cell(b)} | {r.get('deepgemm_over_ours', '-')} | "
          f"{a.get('error', a.get('reason', ''))} | {b.get('error', b.get('reason', ''))} |")
print("(H200, sm_90a build of DeepSeek's SM120 tf32 mma.sync kernel: the same instruction class SM120 runs; "
      "ratio > 1: ours faster)")
PY
exit $rc
