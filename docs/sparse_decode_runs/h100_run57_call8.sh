#!/bin/bash
# run 57 call 8, on the tree of the swizzle commit (6a2917a): the README's main command on the device (build with the
# H100's arch added, then the doctor's self-tests), the sparse-decode GPU tests and 200 fuzz cases on that library
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
{ DSV4_KERNEL_EXTRA_ARCHS=90a NVCC_THREADS=8 scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor; echo "README main command rc=$?"; } > $OUT/main_command.log 2>&1
grep -i 'rc=\|PASS\|FAIL\|error' $OUT/main_command.log | head -n 30
L=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
cp $L $OUT/final.so
{
echo "== tests"; DSV4_KERNEL_LIB=$L timeout 200 python -m pytest -q tests/test_sparse_decode.py tests/test_extension_build.py 2>&1 | tail -n 3
echo "== fuzz"; DSV4_KERNEL_LIB=$L DSV4_FUZZ_CASES=200 DSV4_FUZZ_SEED=57100 timeout 100 python -m pytest -q tests/test_sparse_decode.py -k fuzz 2>&1 | tail -n 3
} > $OUT/pytest.log 2>&1
grep -v '^\.\.\.' $OUT/pytest.log
