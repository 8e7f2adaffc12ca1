#!/bin/bash
# run 62 call 5: triton 3.8.0 assembled (as call 2), then scripts/stress_hc_prenorm.py under it, native and
# DISABLE_MMA_V3=1, and test_hc_prenorm.py once more (the AOT compiles deselected).
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/run62.so
cp .whl/t38.1 /tmp/t38parts/ 2>/dev/null
cat /tmp/t38parts/t38.0 /tmp/t38parts/t38.1 > /tmp/t38.tar.xz
echo "$(cut -d' ' -f1 .whl/t38.sha256)  /tmp/t38.tar.xz" | sha256sum -c - || exit 3
rm -rf /tmp/t38 && mkdir -p /tmp/t38 && tar -C /tmp/t38 -xJf /tmp/t38.tar.xz || exit 4
sed -i "/amd/d" /tmp/t38/triton-3.8.0.dist-info/entry_points.txt   # the trimmed tree has no AMD backend
export PYTHONPATH=/tmp/t38 TRITON_CACHE_DIR=/tmp/tcache38
python3 scripts/stress_hc_prenorm.py --budget 120 --rounds 100000 --seed 1 > $OUT/stress38_native.log 2>&1
echo "native rc=$?"; tail -n 24 $OUT/stress38_native.log | cut -c1-230
DISABLE_MMA_V3=1 python3 scripts/stress_hc_prenorm.py --budget 120 --rounds 100000 --seed 2 > $OUT/stress38_mma.log 2>&1
echo "mma rc=$?"; tail -n 24 $OUT/stress38_mma.log | cut -c1-230
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_hc_prenorm.py -k "not sm120_aot" > $OUT/pytest_hc38.log 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_hc38.log | cut -c1-200
