"""Compile, on a machine without a GPU, the JIT module of SGLang 0.5.17 that setups (a) and (c) need before their
first MoE call, so that the GPU machine loads it instead of compiling it (~5 min of one nvcc there, device time).

    python3.12 tools/e2e/prebuild_jit.py            # -> .e2e/jit/<cache dir>/<module>.so (git-ignored, carried)

What it builds: SGLang's Marlin MoE module (``_jit_moe_wna16_marlin_module(bf16, is_ep=False, has_bias=False)``,
the arguments of moe_wna16_marlin.py at TP without EP) and the other JIT modules of the Marlin MXFP4 path
(``gptq_marlin_repack``, ``moe_align_single_token``, ``moe_topk_sum``: the list of
deepseek_v4_kernel/bench/moe_competitors.py's MARLIN_JIT) for sm_90a (the test GPU), through SGLang's own ``load_jit``
under ``override_jit_cuda_arch(9, 0)``. SGLang names the cache directory by the sources' content, the target and the
tvm-ffi version, and loads a ``.so`` found there without compiling (kernels/jit/utils/compile.py), so the module
built here is the one the server would build. ``run_e2e.py --stages fetch`` copies .e2e/jit to the GPU machine and
``prepare`` installs it into the tvm-ffi cache.

Needs Python 3.12 (tvm-ffi's extension uses 3.12's C API), nvcc with sm_90a, and the base part of the bundle
(.e2e/parts/base.tar.xz.*), which it unpacks into a temporary directory. torch is not needed: a stand-in with the
few names SGLang's JIT helpers read at import is put on the path.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

TORCH_STAND_IN = textwrap.dedent('''
    # build-time stand-in for torch: only what SGLang's JIT helpers read at import and when naming a module
    import types as _t
    class dtype:
        def __init__(self, name): self.name = name
        def __repr__(self): return "torch." + self.name
    for _n in ("float64 float32 float16 bfloat16 float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz "
               "int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool").split():
        globals()[_n] = dtype(_n)
    class Tensor: pass
    class device: pass
    version = _t.SimpleNamespace(hip=None, cuda=None)
    compiler = _t.SimpleNamespace(disable=lambda f=None, **k: f if f is not None else (lambda g: g))
    def _no_gpu(*a, **k): raise RuntimeError("no GPU on the build machine")
    cuda = _t.SimpleNamespace(current_device=_no_gpu, get_device_capability=_no_gpu, is_available=lambda: False)
''')

BUILD = textwrap.dedent('''
    import os, sys, types
    site, stub = sys.argv[1], sys.argv[2]
    sys.path.insert(0, site)
    import tvm_ffi, tvm_ffi.cpp  # before the torch stand-in: tvm_ffi uses a torch it finds
    sys.path.insert(0, stub)
    for name in ("sglang", "sglang.kernels"):  # their __init__s import the server's dependencies
        m = types.ModuleType(name); m.__path__ = [os.path.join(site, *name.split("."))]; sys.modules[name] = m
    u = types.ModuleType("sglang.utils"); u.is_in_ci = lambda: False; sys.modules["sglang.utils"] = u
    import torch
    from sglang.kernels.jit.utils.arch import override_jit_cuda_arch
    from sglang.kernels.ops.moe.moe_wna16_marlin import _jit_moe_wna16_marlin_module
    from sglang.kernels.ops.quantization.gptq_marlin_repack import _jit_gptq_marlin_repack_module
    from sglang.kernels.ops.moe.moe_align_single_token import _jit_align_single_token_module
    from sglang.kernels.ops.moe.moe_topk_sum import _jit_topk_sum_module
    with override_jit_cuda_arch(9, 0):
        _jit_moe_wna16_marlin_module(torch.bfloat16, False, False)
        # the rest of the Marlin MXFP4 path (each seconds of nvcc, but on the GPU machine): the weight repack of
        # process_weights_after_loading, the one-token routing sort, the top-k sum (PDL: sm_90 has it)
        _jit_gptq_marlin_repack_module()
        _jit_align_single_token_module()
        _jit_topk_sum_module()
''')


def cuda_home() -> str:
    """tvm-ffi links -lcudart from $CUDA_HOME/lib64, else from beside the nvcc on PATH (which may be a wrapper
    script elsewhere): the first of CUDA_HOME, the real nvcc's toolkit and /usr/local/cuda that has libcudart."""
    nvcc = os.path.realpath(shutil.which("nvcc") or "")
    for home in (os.environ.get("CUDA_HOME"), os.path.dirname(os.path.dirname(nvcc)), "/usr/local/cuda"):
        if home and glob.glob(os.path.join(home, "lib64", "libcudart.so*")):
            return home
    raise SystemExit("prebuild_jit: no CUDA toolkit with lib64/libcudart.so found: set CUDA_HOME")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, ".e2e", "jit"), help="where the cache directories go")
    ap.add_argument("--site", help="an unpacked base part (default: unpack .e2e/parts/base.tar.xz.* to a temp dir)")
    args = ap.parse_args(argv)
    if sys.version_info[:2] != (3, 12):
        ap.error(f"needs Python 3.12 (the bundle's tvm-ffi extension), this is {sys.version.split()[0]}")
    if shutil.which("nvcc") is None:
        ap.error("needs nvcc on PATH (with sm_90a)")
    tmp = tempfile.mkdtemp(prefix="dsv4_jit_")
    try:
        site = args.site
        if site is None:
            parts = sorted(glob.glob(os.path.join(REPO, ".e2e", "parts", "base.tar.xz.*")))
            if not parts:
                ap.error("no .e2e/parts/base.tar.xz.* (python3 tools/e2e/build_bundle.py makes them) and no --site")
            site = os.path.join(tmp, "site")
            os.makedirs(site)
            subprocess.run(f"cat {' '.join(parts)} | xz -dc | tar -x -C {site}", shell=True, check=True)
        stub = os.path.join(tmp, "stub", "torch")
        os.makedirs(stub)
        with open(os.path.join(stub, "__init__.py"), "w") as f:
            f.write(TORCH_STAND_IN)
        cache = os.path.join(tmp, "cache")
        env = dict(os.environ, TVM_FFI_CACHE_DIR=cache, PYTHONPATH="", CUDA_HOME=cuda_home())
        t0 = time.time()
        r = subprocess.run([sys.executable, "-c", BUILD, site, os.path.dirname(stub)], env=env)
        if r.returncode:
            print(f"prebuild_jit: the build failed (exit {r.returncode})", file=sys.stderr)
            return r.returncode
        os.makedirs(args.out, exist_ok=True)
        for d in sorted(os.listdir(cache)):
            sos = glob.glob(os.path.join(cache, d, "*.so"))
            if len(sos) != 1:
                print(f"prebuild_jit: {d}: expected one .so, found {len(sos)}", file=sys.stderr)
                return 1
            dest = os.path.join(args.out, d)
            shutil.rmtree(dest, ignore_errors=True)
            os.makedirs(dest)
            shutil.copy2(sos[0], dest)
            print(f"prebuild_jit: {dest}/{os.path.basename(sos[0])} "
                  f"({os.path.getsize(sos[0]) / 2**20:.1f} MiB, {time.time() - t0:.0f} s)")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
