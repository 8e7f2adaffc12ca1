#!/bin/bash
# run 55 call 3: the deep-gather 16 / 32-head block (deep.so, -DDSV4_WS_DEEP=1) against the head (head.so)
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
T=tests/test_sparse_decode.py
{
for impl in mma64wsh16 mma64wsh32 auto; do
  echo "== deep $impl"; DSV4_KERNEL_LIB=build/r55/deep.so DSV4_SPARSE_DECODE_IMPL=$impl timeout 80 python -m pytest -q -x $T 2>&1 | tail -n 3
done
echo "== deep fuzz"; DSV4_KERNEL_LIB=build/r55/deep.so DSV4_FUZZ_CASES=150 DSV4_FUZZ_SEED=56000 timeout 60 python -m pytest -q $T -k fuzz 2>&1 | tail -n 3
} > $OUT/pytest.log 2>&1
tail -n 20 $OUT/pytest.log
for r in 1 2; do for L in head deep; do
  DSV4_KERNEL_LIB=build/r55/$L.so timeout 50 python docs/sparse_decode_runs/h100_run54_time_shapes.py $L 2>&1 | grep -v "^\[deepseek"
done; done > $OUT/ab_narrow.log 2>&1
grep -v JSON $OUT/ab_narrow.log
for r in 1 2; do for L in head deep; do
  R54_WIDE=1 DSV4_KERNEL_LIB=build/r55/$L.so timeout 75 python docs/sparse_decode_runs/h100_run54_time_shapes.py $L 2>&1 | grep -v "^\[deepseek"
done; done > $OUT/ab_wide.log 2>&1
grep -c us $OUT/ab_wide.log
