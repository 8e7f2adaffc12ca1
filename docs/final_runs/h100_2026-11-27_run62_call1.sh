#!/bin/bash
# run 62 call 1: the first half of a trimmed triton 3.8.0 (SGLang 0.5.23's pin; cp312 wheel without its AMD backend,
# proton, CUPTI, ptxas-blackwell and nvdisasm, as an xz tarball in two pieces, .whl/t38.0 and .whl/t38.1: the wheel
# alone is over a call's 64 MiB) is kept on the machine for call 2, which must follow within the 30 s the machine
# stays warm. The pieces were made here (no GPU) by:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d W triton==3.8.0   # 248 MB wheel
#   cd X && unzip -q W/triton-3.8.0-*.whl && rm -rf triton/backends/nvidia/lib/cupti* \
#       triton/backends/nvidia/bin/ptxas-blackwell triton/backends/nvidia/bin/nvdisasm triton/_C/libproton.so \
#       triton/instrumentation triton/backends/amd
#   tar cf - triton triton-3.8.0.dist-info | xz -9 -T8 > t38.tar.xz                          # 95 MB
#   split -b 48000000 -d -a 1 t38.tar.xz .whl/t38.; sha256sum t38.tar.xz > .whl/t38.sha256
# (sha256 0e5aa9e779b8477148174b073dc9475d7c94ccd9c773a085e685b973827df585); ptxas (sm_90) stays, sm_90 needs no
# ptxas-blackwell.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/t38parts && cp .whl/t38.0 /tmp/t38parts/ && ls -la /tmp/t38parts
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"
