#!/bin/bash
# run 60 call 3: scripts/ab_sparse_decode.py (new in run 60) on the device: the head's library (base.so) against itself
# under a second tag (the method's spread) and against the timeline-only traced build of call 1 (nocyc.so: what the
# block timeline's %globaltimer reads cost), narrow set, two rounds, alternating processes.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 560 python3 scripts/ab_sparse_decode.py --set narrow --rounds 2 --out $OUT/ab.json \
  base=build/r60/base.so same=build/r60/base.so nocyc=build/r60/nocyc.so 2>&1 | grep -v "^\[deepseek_v4_kernel"
echo "ab rc=${PIPESTATUS[0]}"
