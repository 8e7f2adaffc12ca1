#!/bin/bash
# run 60 call 4: scripts/device_sparse_decode_diag.sh (new in run 60: the first sparse-decode measurements for a new GPU
# in one run: 7 libraries built here, the trace tool on each, the auto-kernel launch sweep and the fit) on the H100.
D=/tmp/diag
OUT=$D timeout 590 bash scripts/device_sparse_decode_diag.sh > $D.console.log 2>&1; echo "diag rc=$?"
cp $D.console.log $OUT/console.log; cp $D/summary.log $D/trace.log $D/fit.log $OUT/ 2>/dev/null
cp $D/sweep/sweep_sparse_decode.json $OUT/sweep.json 2>/dev/null
tar -C $D --exclude libs -czf $OUT/diag_logs.tar.gz . ; cat $D/summary.log; tail -n 30 $D/fit.log
