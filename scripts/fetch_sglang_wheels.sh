#!/usr/bin/env bash
# Download the real SGLang wheels the patch tests run against (no dependencies, no install)
# and unpack their Python sources into .sglang/ (git-ignored):
#   .sglang/sglang-<version>/   one per version in deepseek_v4_kernel/patch/targets.py:TESTED
#   .sglang/flash_mla/          the FlashMLA wheel SGLang 0.5.12 calls (Python files only;
#                               its CUDA libraries cannot load without a GPU)
# Re-running skips what is already there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${DSV4_SGLANG_WHEELS_DIR:-$root/.sglang}
mkdir -p "$dest/_dl"
PY=${PYTHON:-python3}
versions=$(cd "$root" && $PY -c 'from deepseek_v4_kernel.patch.targets import TESTED; print(" ".join(TESTED))')

unpack() {  # wheel dir, pattern
    $PY - "$1" "$2" <<'PYEOF'
import sys, zipfile, glob
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    # Python sources and metadata only: the tests import them on a CPU machine.
    z.extractall(sys.argv[2], [n for n in z.namelist() if not n.endswith((".so", ".cubin", ".a"))])
PYEOF
}

for v in $versions; do
    out="$dest/sglang-$v"
    [ -d "$out/sglang" ] && continue
    rm -rf "$dest/_dl/$v"
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux_2_34_x86_64 \
        "sglang==$v" -d "$dest/_dl/$v"
    unpack "$dest/_dl/$v" "$out"
    echo "sglang $v -> $out"
done
if [ ! -d "$dest/flash_mla/flash_mla" ]; then
    rm -rf "$dest/_dl/flash_mla"
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64 \
        "sgl-flash-mla==1.0.0" -d "$dest/_dl/flash_mla"
    unpack "$dest/_dl/flash_mla" "$dest/flash_mla"
    echo "sgl-flash-mla -> $dest/flash_mla"
fi
rm -rf "$dest/_dl"
