#!/bin/bash
# run 61 call 8 (review): the op's row pointers through one helper (row(t, b0)), batch_parts' candidates and the model
# cost as functions the sweep script calls (decisions identical on 90496 shapes, checked on CPU): test_sparse_decode.py
# with the library built from the head's csrc/ (carried as build/r61/review.so), and the quick cut sweep.
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=build/r61/review.so
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_decode.py 2>&1 | tail -n 3 | tee $OUT/pytest.log
timeout 150 python3 scripts/sweep_sparse_decode_waves.py --quick --separator --rounds 2 --out $OUT/sweep_waves.json 2>&1 \
  | grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once" | tee $OUT/sweep_waves.log
