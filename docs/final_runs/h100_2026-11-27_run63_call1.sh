#!/bin/bash
# run 63 call 1: the Triton ops under triton 3.9.0 (torch 2.15.0's pin, `triton~=3.9.0`: the Triton the next SGLang
# image that moves to torch 2.15 will JIT our kernels with), on the H100, next to the device's 3.6.0.
# The cp312 wheel, trimmed, as one xz tarball carried as .whl/t39.tar.xz (ignored; 52 MB), made here (no GPU) by:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d W triton==3.9.0   # 286 MB wheel
#   cd X && unzip -q W/triton-3.9.0-*.whl && rm -rf triton/backends/nvidia/lib/cupti* \
#       triton/backends/nvidia/bin/ptxas triton/backends/nvidia/bin/nvdisasm triton/_C/libproton.so \
#       triton/instrumentation triton/backends/amd triton/plugins triton/FileCheck
#   sed -i "/amd/d" triton-3.9.0.dist-info/entry_points.txt; strip --strip-unneeded triton/_C/libtriton.so
#   tar cf - triton triton-3.9.0.dist-info | xz -9 > t39.tar.xz; sha256sum t39.tar.xz > .whl/t39.sha256
# (sha256 fd4d07f48e76569975f75ddcc00ce11488055c1139b91557ea16ebe20272ed19). Unlike 3.8.0, 3.9.0 compiles sm_90 and
# up with ptxas-blackwell (backends/nvidia/compiler.py get_ptxas), so that one stays and the legacy ptxas goes.
# This call: the Triton-op tests with mma.sync builds (DISABLE_MMA_V3=1, SM120's class) under 3.9.0 on the working
# tree (the interpreter-mode fixes of _flat_kernel's clean-up and _reduce_kernel); the MoE's "dequant" and
# "dot_scaled" at decode sizes under 3.6.0 and 3.9.0, two rounds alternating (3.8.0's "dequant" was 1.2-1.7x slower
# than 3.6.0's, run 62; 3.9.0's sm_120a build is back to 3.6.0's registers and shared memory); the indexer-logits and
# hc_prenorm benches under both.
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DISABLE_MMA_V3=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "$(cat .whl/t39.sha256)  .whl/t39.tar.xz" | sha256sum -c - || exit 3
rm -rf /tmp/t39 && mkdir -p /tmp/t39 && tar -C /tmp/t39 -xJf .whl/t39.tar.xz || exit 4
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, 'device triton', triton.__version__)"
PYTHONPATH=/tmp/t39 python3 -c "import triton; print('triton', triton.__version__, triton.__file__)" || exit 5
run39() { PYTHONPATH=/tmp/t39 TRITON_CACHE_DIR=/tmp/tcache39 "$@"; }
run36() { TRITON_CACHE_DIR=/tmp/tcache36 "$@"; }
( time run39 timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_indexer_logits.py tests/test_hc_prenorm.py \
    tests/test_fp4_moe.py -k "not sm120_aot" ) > $OUT/pytest_triton39_mma.log 2>&1
echo "pytest 3.9 mma rc=$?"; grep -E "passed|failed|^FAILED|^real" $OUT/pytest_triton39_mma.log | cut -c1-200
T=64,128,192,256,512
for r in 1 2; do for v in 36 39; do
  mkdir -p /tmp/ab$v$r
  ( time run$v timeout 110 python3 scripts/bench_fp4_moe.py --out /tmp/ab$v$r --tokens $T --impls dequant,dot_scaled \
      --no-baselines ) > /tmp/ab_$v$r.log 2>&1
  echo "== triton $v round $r rc=$?" | tee -a $OUT/ab_fp4_moe_dequant_dot_scaled.log
  cat /tmp/ab_$v$r.log >> $OUT/ab_fp4_moe_dequant_dot_scaled.log
  grep -E "^\| [0-9]|^real" /tmp/ab_$v$r.log | cut -d'|' -f2,4,5,6
done; done
for op in indexer_logits hc_prenorm; do for v in 36 39; do
  mkdir -p /tmp/b$v/$op
  ( time run$v timeout 60 python3 scripts/bench_$op.py --out /tmp/b$v/$op ) > $OUT/bench_${op}_triton$v.log 2>&1
  echo "$op triton $v rc=$?"
done; done
