#!/bin/bash
# run 55 call 4: the library of the working tree (new.so: impl 8 = the deep-gather 16-head block; every other kernel's
# SASS identical to the head's): tests with auto and with impl 8 forced, fuzz, and the tiles-per-block sweep of
# mma64wsh16 against mma64wsh16deep
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
T=tests/test_sparse_decode.py
L=build/r55/new.so
{
for impl in auto mma64wsh16deep; do
  echo "== $impl"; DSV4_KERNEL_LIB=$L DSV4_SPARSE_DECODE_IMPL=$impl timeout 90 python -m pytest -q $T 2>&1 | tail -n 3
done
echo "== fuzz"; DSV4_KERNEL_LIB=$L DSV4_FUZZ_CASES=200 DSV4_FUZZ_SEED=57000 timeout 70 python -m pytest -q $T -k fuzz 2>&1 | tail -n 3
echo "== extension build + doctor"; DSV4_KERNEL_LIB=$L timeout 60 python -m pytest -q tests/test_doctor.py 2>&1 | tail -n 2
} > $OUT/pytest.log 2>&1
cat $OUT/pytest.log | grep -v "^\.\.\.\."
for r in 1 2; do for impl in mma64wsh16 mma64wsh16deep; do
  DSV4_KERNEL_LIB=$L timeout 60 python build/r55/deep_sweep.py $impl 2>&1 | grep -v "^\[deepseek"
done; done > $OUT/deep_sweep.log 2>&1
grep -v JSON $OUT/deep_sweep.log | tail -n 32
