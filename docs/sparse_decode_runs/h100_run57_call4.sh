#!/bin/bash
# run 57 call 4: kernel_f8.cuh with the P V warps' hand-over two tiles ahead (after P V(t), as kernel_ws.cuh's
# stage_next): w0 (variant 0, HMUL2 scaling), w2 (no K conversion, timing only); tests with w0 forced first
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== forced mma64f8 (w0)"; DSV4_KERNEL_LIB=build/r57/w0.so DSV4_SPARSE_DECODE_IMPL=mma64f8 timeout 100 python -m pytest -q -x tests/test_sparse_decode.py -k "not fuzz" 2>&1 | grep -v '^\.\.\.' | tail -n 15
for r in 1 2; do for v in 0 2; do
  echo "== w$v round $r"; DSV4_KERNEL_LIB=build/r57/w$v.so timeout 100 python docs/sparse_decode_runs/h100_run57_time_impls.py mma64ws,mma64f8 1 mini 2>&1 | grep -v '^\[deepseek\|^JSON'
done; done
