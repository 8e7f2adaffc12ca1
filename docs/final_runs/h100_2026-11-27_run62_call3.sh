#!/bin/bash
# run 62 call 3 (inline command, recorded here): call 2's one failure
# (test_gpu_cuda_graph_replay_and_determinism[512-cfg5] under triton 3.8.0) rerun alone, twice under 3.8.0 and once
# under the device's 3.6.0. Output (no files): 14 passed, 14 passed; 3.6: 14 passed.
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/run62.so
for i in 1 2; do PYTHONPATH=/tmp/t38 TRITON_CACHE_DIR=/tmp/tcache38 python3 -m pytest -q -p no:cacheprovider \
  tests/test_hc_prenorm.py -k "cuda_graph_replay_and_determinism" 2>&1 | tail -3; done
echo "== 3.6"; python3 -m pytest -q -p no:cacheprovider tests/test_hc_prenorm.py -k "cuda_graph_replay_and_determinism" 2>&1 | tail -2
