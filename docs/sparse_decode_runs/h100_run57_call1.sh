#!/bin/bash
# run 57 calls 1 and 2: kernel_f8.cuh forced through test_sparse_decode.py, then timed against mma64ws. Libraries here and
# in calls 3-5: the tree of h100_run57_fp8_in_place.diff, DSV4_NVCC_FLAGS="-DDSV4_F8_VARIANT=v -DDSV4_F8_ABL=a"
# DSV4_KERNEL_EXTRA_ARCHS=90a bash scripts/build_ext.sh build/r57/<name>.so (f8 / v0 / w0: 0 0; v1: 1 0; v2 / w2: 2 0;
# w3: 2 2; w4: 2 6; v* before, w* after the hand-over two tiles ahead)
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
L=build/r57/f8.so
T=tests/test_sparse_decode.py
echo "== forced mma64f8"; DSV4_KERNEL_LIB=$L DSV4_SPARSE_DECODE_IMPL=mma64f8 timeout 150 python -m pytest -q -x $T -k "not fuzz" 2>&1 | grep -v '^\.\.\.' | tail -n 40
echo "== timing"; DSV4_KERNEL_LIB=$L timeout 200 python docs/sparse_decode_runs/h100_run57_time_impls.py mma64ws,mma64f8 2 2>&1 | grep -v '^\[deepseek'
