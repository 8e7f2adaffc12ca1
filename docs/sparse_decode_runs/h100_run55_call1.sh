#!/bin/bash
# run 55 call 1: the bit-move dequantisation in the warp-specialised block (bits.so) against the head (head.so):
# tests with the variant (auto and each ws kernel forced), the widened bit-exact test on both, fuzz, narrow A/B.
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
T=tests/test_sparse_decode.py
{
for impl in auto mma64ws mma64wsh16 mma64wsh32; do
  echo "== bits $impl"; DSV4_KERNEL_LIB=build/r55/bits.so DSV4_SPARSE_DECODE_IMPL=$impl timeout 100 python -m pytest -q $T 2>&1 | tail -n 3
done
echo "== head bit_exact"; DSV4_KERNEL_LIB=build/r55/head.so timeout 60 python -m pytest -q $T -k bit_exact 2>&1 | tail -n 3
echo "== bits fuzz"; DSV4_KERNEL_LIB=build/r55/bits.so DSV4_FUZZ_CASES=200 DSV4_FUZZ_SEED=55000 timeout 100 python -m pytest -q $T -k fuzz 2>&1 | tail -n 3
} > $OUT/pytest.log 2>&1
tail -n 40 $OUT/pytest.log
for r in 1 2; do for L in head bits; do
  DSV4_KERNEL_LIB=build/r55/$L.so timeout 60 python docs/sparse_decode_runs/h100_run54_time_shapes.py $L 2>&1 | grep -v "^\[deepseek"
done; done > $OUT/ab_narrow.log 2>&1
cat $OUT/ab_narrow.log | grep -v JSON
