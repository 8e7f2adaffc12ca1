#!/bin/bash
# run 61 call 3: call 1 again with the cut's first grid as a plain launch (params.h plain_launch; call 2 found the PDL
# launch of that grid costing time; its reading, the previous call's combine starved, was not confirmed later).
# Kernels unchanged; the launcher and api.cu take the new field; the library built on the dev machine, carried as
# build/r61/plain.so: test_sparse_decode.py, then the cut sweep (scripts/sweep_sparse_decode_waves.py, 2 rounds) -> $OUT.
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=build/r61/plain.so
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_decode.py 2>&1 | tail -n 15 | tee $OUT/pytest.log
timeout 330 python3 scripts/sweep_sparse_decode_waves.py --rounds 2 --out $OUT/sweep_waves.json 2>&1 \
  | grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once" | tee $OUT/sweep_waves.log
echo "sweep rc=${PIPESTATUS[0]}"
