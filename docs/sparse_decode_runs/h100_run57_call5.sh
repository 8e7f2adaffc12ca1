#!/bin/bash
# run 57 call 5: ablations of kernel_f8.cuh (timing only): w2 no K conversion; w3 also no Q conversion; w4 also no P V
# conversion or P scaling
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
for r in 1 2; do for v in 2 3 4; do
  echo "== w$v round $r"; DSV4_KERNEL_LIB=build/r57/w$v.so timeout 100 python docs/sparse_decode_runs/h100_run57_time_impls.py mma64ws,mma64f8 1 mini 2>&1 | grep -v '^\[deepseek\|^JSON'
done; done
