#!/bin/bash
# run 62 call 12 (inline command, recorded here; same machine as calls 10-11, triton 3.8.0 kept from call 11):
# test_fp4_moe.py after the fix of test_cuda_graph_capture_replay's expected impl (call 11's two failures: it expected
# "dequant" for the Triton path, the decode default under 3.6 only), under 3.8.0 with DISABLE_MMA_V3=1 and natively,
# and its graph / default-impl tests under the device's 3.6.0.
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
ls /tmp/t38/triton >/dev/null || exit 5
export PYTHONPATH=/tmp/t38 TRITON_CACHE_DIR=/tmp/tcache38
DISABLE_MMA_V3=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_fp4_moe.py -k "not sm120_aot" > $OUT/pytest_fp4_triton38_mma_fixed.log 2>&1
echo "mma rc=$?"; tail -n 2 $OUT/pytest_fp4_triton38_mma_fixed.log
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_fp4_moe.py -k "not sm120_aot" > $OUT/pytest_fp4_triton38_native_fixed.log 2>&1
echo "native rc=$?"; tail -n 2 $OUT/pytest_fp4_triton38_native_fixed.log
unset PYTHONPATH; export TRITON_CACHE_DIR=/tmp/tcache36
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fp4_moe.py -k "cuda_graph_capture_replay or default_impl" > $OUT/pytest_fp4_triton36_fixed.log 2>&1
echo "3.6 rc=$?"; tail -n 1 $OUT/pytest_fp4_triton36_fixed.log
