#!/bin/bash
# run 60 call 5 (review): the op's launch decision moved into ops/sparse_decode.launch_plan (the op and the trace tool
# call it; same logic): test_sparse_decode.py with the head's library (csrc/ unchanged, build/r60/base.so), and the
# trace tool's run on two shapes with the traced build (auto and IMPL=mma64).
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
DSV4_KERNEL_LIB=build/r60/base.so timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_decode.py 2>&1 | tail -n 3
for I in "" mma64; do
  DSV4_KERNEL_LIB=build/r60/trace.so TAG=trace IMPL=$I SHAPES="1,64,512;128,64,512" timeout 100 \
    python3 scripts/trace_sparse_decode.py run 2>&1 | grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once"
  echo "trace IMPL=$I rc=${PIPESTATUS[0]}"
done
