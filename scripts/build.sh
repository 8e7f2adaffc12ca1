#!/usr/bin/env bash
# Build the product directory users mount into an unmodified SGLang container:
#   build/dsv4/sitecustomize.py           (runs in every Python process on PYTHONPATH)
#   build/dsv4/deepseek_v4_kernel/        (the package)
#   build/dsv4/deepseek_v4_kernel/_C.so   (the CUDA extension, sm_120a; C ABI, no torch ABI inside)
#
# Usage:
#   scripts/build.sh                      build with this machine's nvcc (no GPU needed)
#   scripts/build.sh --docker IMAGE       build inside IMAGE (e.g. lmsysorg/sglang:v0.5.23) with its nvcc,
#                                         so the CUDA runtime matches the image; nothing is written into it
#   scripts/build.sh --no-ext             package only (the ops that need the extension hand back to SGLang)
# Env: DSV4_KERNEL_EXTRA_ARCHS="90a"      also build for these archs (testing on an H100)
#      NVCC=/path/to/nvcc                 compiler to use in local mode
#      DSV4_BUILD_DIR=...                 output directory (default build/dsv4)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${DSV4_BUILD_DIR:-$root/build/dsv4}
mode=local image=""
while [ $# -gt 0 ]; do
    case "$1" in
        --docker) mode=docker; image=${2:?--docker needs an image name}; shift 2 ;;
        --no-ext) mode=none; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

rm -rf "$out"
mkdir -p "$out"
cp "$root/sitecustomize.py" "$out/"
# The package without caches or a stale extension.
(cd "$root" && tar --exclude='__pycache__' --exclude='*.pyc' --exclude='_C*.so' -cf - deepseek_v4_kernel) | tar -C "$out" -xf -

case "$mode" in
    local)
        bash "$root/scripts/build_ext.sh" "$out/deepseek_v4_kernel/_C.so" ;;
    docker)
        command -v docker >/dev/null || { echo "build.sh: docker not found (use local mode: scripts/build.sh)" >&2; exit 1; }
        docker run --rm -e DSV4_KERNEL_EXTRA_ARCHS="${DSV4_KERNEL_EXTRA_ARCHS:-}" \
            -v "$root:/src:ro" -v "$out:/out" "$image" \
            bash /src/scripts/build_ext.sh /out/deepseek_v4_kernel/_C.so ;;
    none)
        echo "build.sh: --no-ext: no CUDA extension; sparse decode will hand back to SGLang" ;;
esac
# .pyc files for a read-only mount (-v ...:/dsv4:ro), where Python cannot write them and would compile every module it
# imports at each start. A .pyc belongs to one Python version: compile with the interpreter that will run SGLang (the
# image's in --docker mode) and with this machine's. checked-hash: valid whatever mtimes the files get when copied,
# and a hand-edited .py is noticed (compiled at each start) instead of a stale .pyc running.
if [ "$mode" = docker ]; then
    docker run --rm -v "$out:/out" "$image" python3 -m compileall -q -j0 --invalidation-mode checked-hash /out
fi
if command -v python3 >/dev/null; then
    python3 -m compileall -q -j0 --invalidation-mode checked-hash "$out"
fi
echo "built $out"
echo "run: docker run --gpus all -v $out:/dsv4:ro -e PYTHONPATH=/dsv4 IMAGE python3 -m sglang.launch_server ..."
