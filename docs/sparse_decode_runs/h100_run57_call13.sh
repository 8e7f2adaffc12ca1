#!/bin/bash
# run 57 call 13, on the tree of 8e68482 (token_row by shift and mask): the README main command on the device (build
# sm_120a + sm_90a, doctor), the sparse-decode GPU tests and 200 fuzz cases on that library, then the README benches
# (44-row table and TP-rank table; SGLang 0.5.23's Triton fallback carried)
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
{ DSV4_KERNEL_EXTRA_ARCHS=90a NVCC_THREADS=8 scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor; echo "README main command rc=$?"; } > $OUT/main_command.log 2>&1
grep -i 'rc=\|PASS\|FAIL\|error' $OUT/main_command.log | cut -c1-160 | head -n 12
L=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
{
echo "== tests"; DSV4_KERNEL_LIB=$L timeout 150 python -m pytest -q tests/test_sparse_decode.py tests/test_extension_build.py 2>&1 | tail -n 3
echo "== fuzz"; DSV4_KERNEL_LIB=$L DSV4_FUZZ_CASES=200 DSV4_FUZZ_SEED=57300 timeout 90 python -m pytest -q tests/test_sparse_decode.py -k fuzz 2>&1 | tail -n 3
} > $OUT/pytest.log 2>&1
grep -v '^\.\.\.' $OUT/pytest.log
mkdir -p $OUT/bench $OUT/tp
DSV4_KERNEL_LIB=$L timeout 260 python3 scripts/bench_sparse_decode.py --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc=$?"
DSV4_KERNEL_LIB=$L timeout 150 python3 scripts/bench_sparse_decode_tp_heads.py --out $OUT/tp > $OUT/bench_tp.log 2>&1; echo "tp rc=$?"
