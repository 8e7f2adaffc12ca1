#!/bin/bash
# run 62 call 11 (the session's head tree): triton 3.8.0 assembled (as call 2); the three Triton-op test files on the
# GPU under it (AOT deselected) with call 10's library, DISABLE_MMA_V3=1 (mma.sync builds, SM120's class) for
# test_fp4_moe.py and test_hc_prenorm.py, then natively; the doctor.
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
[ -f "$DSV4_KERNEL_LIB" ] || { echo "no library from call 10"; exit 2; }
cp .whl/t38.1 /tmp/t38parts/ 2>/dev/null
cat /tmp/t38parts/t38.0 /tmp/t38parts/t38.1 > /tmp/t38.tar.xz
echo "$(cut -d' ' -f1 .whl/t38.sha256)  /tmp/t38.tar.xz" | sha256sum -c - || exit 3
rm -rf /tmp/t38 && mkdir -p /tmp/t38 && tar -C /tmp/t38 -xJf /tmp/t38.tar.xz || exit 4
sed -i "/amd/d" /tmp/t38/triton-3.8.0.dist-info/entry_points.txt   # the trimmed tree has no AMD backend
export PYTHONPATH=/tmp/t38 TRITON_CACHE_DIR=/tmp/tcache38
python3 -c "import triton; print('triton', triton.__version__)"
DISABLE_MMA_V3=1 timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_fp4_moe.py tests/test_hc_prenorm.py \
  -k "not sm120_aot" > $OUT/pytest_triton38_mma.log 2>&1
echo "mma pytest rc=$?"; tail -n 2 $OUT/pytest_triton38_mma.log | cut -c1-200
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/test_indexer_logits.py tests/test_hc_prenorm.py \
  tests/test_fp4_moe.py -k "not sm120_aot" > $OUT/pytest_triton38_native.log 2>&1
echo "native pytest rc=$?"; tail -n 2 $OUT/pytest_triton38_native.log | cut -c1-200
timeout 100 python3 -m deepseek_v4_kernel doctor > $OUT/doctor_triton38.log 2>&1
echo "doctor rc=$?"; grep -E "PASS|FAIL|versions" $OUT/doctor_triton38.log | cut -c1-160
