#!/bin/bash
# run 63 call 3: triton 3.9.0 (.whl/t39.tar.xz, recipe: call 1), library as call 2 (build/run63_sm90a.so). The
# repeated-call stress of hc_prenorm with mma.sync builds (DISABLE_MMA_V3=1: SM120's class, where presplit stays on
# under every Triton); the Triton-op tests with native builds (wgmma on sm_90); the doctor (its Triton-dependent
# choices line under 3.9.0, every self-test).
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/run63_sm90a.so
echo "$(cat .whl/t39.sha256)  .whl/t39.tar.xz" | sha256sum -c - || exit 3
rm -rf /tmp/t39 && mkdir -p /tmp/t39 && tar -C /tmp/t39 -xJf .whl/t39.tar.xz || exit 4
export PYTHONPATH=/tmp/t39 TRITON_CACHE_DIR=/tmp/tcache39
python3 -c "import triton; print('triton', triton.__version__, triton.__file__)" || exit 5
DISABLE_MMA_V3=1 timeout 100 python3 scripts/stress_hc_prenorm.py --budget 70 --rounds 100000 --seed 2 \
  > $OUT/stress_hc_triton39_mma.log 2>&1
echo "stress mma rc=$?"; grep -v "^\[deep" $OUT/stress_hc_triton39_mma.log | tail -n 22 | cut -c1-120
( time timeout 300 python3 -m pytest -q -rf --tb=line -p no:cacheprovider tests/test_indexer_logits.py \
    tests/test_hc_prenorm.py tests/test_fp4_moe.py -k "not sm120_aot" ) > $OUT/pytest_triton39_native.log 2>&1
echo "pytest 3.9 native rc=$?"; grep -E "passed|failed|^FAILED|^real" $OUT/pytest_triton39_native.log | head -20 | cut -c1-200
( time timeout 120 python3 -m deepseek_v4_kernel doctor ) > $OUT/doctor_triton39.log 2>&1
echo "doctor rc=$?"; grep -E "PASS|FAIL|Triton-dependent|^real" $OUT/doctor_triton39.log | cut -c1-230
