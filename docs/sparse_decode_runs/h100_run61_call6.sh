#!/bin/bash
# run 61 call 6 (the session's tree: batches beyond one wave cut, the rest launched first, the whole waves as a plain
# launch; WAVE_CUT_GAIN 0.95): the README main command on a fresh machine (build sm_120a + sm_90a, doctor, forced; its
# library then used for the rest), the sparse-decode, doctor and patch-target GPU tests, the cut sweep between other
# kernels with each part alone (--separator --parts) and back to back (the bench's method), 2 rounds each -> $OUT.
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
export DSV4_KERNEL_FORCE=1
( time (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > $OUT/main_command.log 2>&1
echo "main command rc=$?"; grep -E "PASS|FAIL" $OUT/main_command.log | cut -c1-200
export DSV4_KERNEL_LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_decode.py tests/test_doctor.py \
  tests/test_patch_targets.py 2>&1 | tail -n 15 | tee $OUT/pytest.log
for MODE in "--separator --parts" ""; do
  echo "== sweep $MODE"
  timeout 200 python3 scripts/sweep_sparse_decode_waves.py $MODE --rounds 2 --out $OUT/sweep_waves${MODE:+_sep}.json 2>&1 \
    | grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once"
done 2>&1 | tee $OUT/sweep_waves.log
