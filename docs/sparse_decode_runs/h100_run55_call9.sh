#!/bin/bash
# run 55 call 9 (review): stage_next serves both pipelines (fold.so); the deep kernel's SASS changed (register
# allocation), every other kernel's is identical. Tests with impl 8 forced and auto, and an A/B of the deep kernel
# against the one timed in calls 4-8 (final2.so) at the 16-head launch shapes, alternating processes, two rounds.
export DSV4_KERNEL_FORCE=1
T=tests/test_sparse_decode.py
{
for impl in mma64wsh16deep auto; do
  echo "== $impl"; DSV4_KERNEL_LIB=build/r55/fold.so DSV4_SPARSE_DECODE_IMPL=$impl timeout 90 python -m pytest -q $T 2>&1 | tail -n 1
done
echo "== fuzz"; DSV4_KERNEL_LIB=build/r55/fold.so DSV4_FUZZ_CASES=100 DSV4_FUZZ_SEED=58000 timeout 60 python -m pytest -q $T -k fuzz 2>&1 | tail -n 1
} > $OUT/pytest.log 2>&1
cat $OUT/pytest.log
for r in 1 2; do for L in final2 fold; do
  DSV4_KERNEL_LIB=build/r55/$L.so timeout 60 python build/r55/deep_sweep.py mma64wsh16deep 2>&1 | grep -v "^\[deepseek" | sed "s/^/$L /"
done; done > $OUT/ab.log 2>&1
grep -v JSON $OUT/ab.log | awk '{print $1, $3, $4, $5, $7, $8}' | head -n 70
