#!/bin/bash
# run 57 call 3: three builds of kernel_f8.cuh (DSV4_F8_VARIANT 0: K NoPE scaled by HMUL2; 1: per-block partial
# accumulators scaled by FFMA; 2: no conversion of K at all, timing only, outputs wrong), each with mma64ws of the
# same library as the reference, mini set, two rounds, one process per library, alternating
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== forced mma64f8, variant 1"; DSV4_KERNEL_LIB=build/r57/v1.so DSV4_SPARSE_DECODE_IMPL=mma64f8 timeout 100 python -m pytest -q -x tests/test_sparse_decode.py -k "not fuzz" 2>&1 | tail -n 3
for r in 1 2; do for v in 0 1 2; do
  echo "== v$v round $r"; DSV4_KERNEL_LIB=build/r57/v$v.so timeout 100 python docs/sparse_decode_runs/h100_run57_time_impls.py mma64ws,mma64f8 1 mini 2>&1 | grep -v '^\[deepseek\|^JSON'
done; done
