#!/usr/bin/env bash
# GPU half of issue 63's tests (the CPU half runs in scripts/test.sh): any index value on every op that takes indices,
# argument checks past the first of the compiled sparse decode, and the new checkpoints' shapes on the GPU.
#   sparse decode: invalid slot indices (< -1, INT32_MIN/MAX, one past the cache) and lengths on every kernel; DSpark
#                  verify s_q 8 over window 128 + V4.1's 1152 compressed positions   tests/test_sparse_decode_indices.py
#   indexer:       block-table columns / page ids outside the tensors skipped; next_n 8  tests/test_indexer_logits.py -k
#   MoE:           ids < 0 / >= E / past 32 bits dropped on the default, cuda_decode, dequant, mxfp8 impls
#   arguments, new checkpoints: tests/test_op_arguments.py, tests/test_new_checkpoints.py (on cuda tensors)
# Needs the library built by `DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh` (build/dsv4). About 75 s on an H200
# (Triton compiles included, cold cache); each group is capped at 150 s.
# Usage (repo root): OUT=/some/dir bash tools/gpu_robust.sh      -> $OUT/robust/{<group>.log,<group>.xml,summary.txt}
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the results}
dir=$OUT/robust
mkdir -p "$dir"
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
[ -f "$DSV4_KERNEL_LIB" ] || { echo "gpu_robust.sh: no $DSV4_KERNEL_LIB (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh)" >&2; exit 2; }
groups=(   # name|test file|-k expression
  "sparse_decode_indices|tests/test_sparse_decode_indices.py|"
  "indexer_indices|tests/test_indexer_logits.py|invalid_indices or next_n_up_to_8"
  "fp4_moe_ids|tests/test_fp4_moe_ids.py|gpu and not dot_scaled"
  "arguments_gpu|tests/test_op_arguments.py|gpu or arguments"
  "new_checkpoints|tests/test_new_checkpoints.py|"
)
rc=0
printf "%-24s %7s %7s %7s %7s %6s\n" group passed failed skipped errors sec > "$dir/summary.txt"
for g in "${groups[@]}"; do
    IFS='|' read -r name file k <<< "$g"
    start=$(date +%s)
    args=(-q -rs -p no:cacheprovider --junitxml="$dir/$name.xml" "$file")
    [ -n "$k" ] && args+=(-k "$k")
    timeout 150 python3 -m pytest "${args[@]}" > "$dir/$name.log" 2>&1 || rc=1
    sec=$(( $(date +%s) - start ))
    python3 - "$dir/$name.xml" "$name" "$sec" >> "$dir/summary.txt" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    s = ET.parse(sys.argv[1]).getroot()
    s = s if s.tag == "testsuite" else s[0]
    n, f, sk, e = (int(s.get(k, 0)) for k in ("tests", "failures", "skipped", "errors"))
    print(f"{sys.argv[2]:<24} {n - f - sk - e:>7} {f:>7} {sk:>7} {e:>7} {sys.argv[3]:>6}")
except Exception as ex:
    print(f"{sys.argv[2]:<24} {'no result (timeout?)':>31} {sys.argv[3]:>6}  {ex}")
PY
    grep -E "^(FAILED|ERROR)" "$dir/$name.log" | head -5 | cut -c1-200
done
cat "$dir/summary.txt"
exit $rc
