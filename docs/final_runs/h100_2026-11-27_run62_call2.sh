#!/bin/bash
# run 62 call 2: triton 3.8.0 assembled from call 1's piece and this call's, then the Triton-op tests on the GPU under
# it (the sm_120a AOT compiles deselected: CI runs those under 3.8 on the CPU), and the README main command's doctor
# (build carried: DSV4_KERNEL_LIB) with every self-test. Its first run failed on import (the trimmed tree had dropped
# the AMD backend but not its entry point); the sed below fixed that, and the logs are the second run's
# (h100_2026-11-27_run62_call2_*).
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1
cp .whl/t38.1 /tmp/t38parts/ 2>/dev/null; ls -la /tmp/t38parts
cat /tmp/t38parts/t38.0 /tmp/t38parts/t38.1 > /tmp/t38.tar.xz
echo "$(cut -d' ' -f1 .whl/t38.sha256)  /tmp/t38.tar.xz" | sha256sum -c - || exit 3
rm -rf /tmp/t38 && mkdir -p /tmp/t38 && tar -C /tmp/t38 -xJf /tmp/t38.tar.xz || exit 4
# the trimmed tree has no AMD backend: drop its entry point (else backend discovery fails on import)
sed -i "/amd/d" /tmp/t38/triton-3.8.0.dist-info/entry_points.txt; cat /tmp/t38/triton-3.8.0.dist-info/entry_points.txt
export PYTHONPATH=/tmp/t38 TRITON_CACHE_DIR=/tmp/tcache38
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, triton.__file__)" \
  | tee $OUT/versions.txt
export DSV4_KERNEL_LIB=$PWD/build/run62.so
( time timeout 420 python3 -m pytest -q -rs -p no:cacheprovider tests/test_indexer_logits.py tests/test_hc_prenorm.py \
    tests/test_fp4_moe.py -k "not sm120_aot" ) > $OUT/pytest_triton38.log 2>&1
echo "pytest rc=$?"; tail -n 12 $OUT/pytest_triton38.log | cut -c1-200
( time timeout 150 python3 -m deepseek_v4_kernel doctor ) > $OUT/doctor_triton38.log 2>&1
echo "doctor rc=$?"; grep -E "PASS|FAIL|triton|^real" $OUT/doctor_triton38.log | cut -c1-180
