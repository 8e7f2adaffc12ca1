"""sgl-deep-gemm's SM120 kernels on an sm_90a GPU, for timing only (issue 62 item 3).

DeepSeek's SM120 ports in sgl-deep-gemm (0.1.5.post1: ``deep_gemm/include/deep_gemm/impls/sm120_*.cuh``) guard their
bodies with ``__CUDA_ARCH__ >= 1200``. This tool copies the installed wheel's headers (never a copy in this
repository) into a temporary directory, relaxes that guard there to ``>= 900`` (the kernels use only mma.sync
m16n8k8 tf32 / m16n8k32 e4m3, TMA and mbarriers, which sm_90a has; the e4m3 mma is emulated there: see
/work/shared/specs/proxy_fidelity.md), builds tools/deepgemm_sm120/hc_prenorm_host.cu (our host code: the TMA
descriptors and the launch shape the kernel implies) with nvcc for sm_90a into a shared library, and times the mHC
pre-norm GEMM against ours (ops/hc_prenorm) after checking both against the float64 reference.

The indexer kernel (``sm120_fp8_paged_mqa_logits``) is not launched: it needs the schedule metadata of
sgl-deep-gemm's own metadata kernel (``scheduler/sm120_paged_mqa_logits.cuh``) and four descriptors over the paged
fused FP8 + scale cache (q 3-D, kv, kv scales, weights) whose strides its host code sets; ``--compile-only`` builds
its instantiation for sm_90a to show that it compiles.

Usage: python3 tools/deepgemm_sm120.py [--compile-only] [--include DIR] [--out JSON] [--m 1,8,64,256]
(``--include``: a deep_gemm/include directory; default the installed sgl-deep-gemm's, found without importing it).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GUARD = re.compile(r"__CUDA_ARCH__\s*>=\s*1200")
INDEXER_PROBE = """
#include <deep_gemm/impls/sm120_fp8_paged_mqa_logits.cuh>
// taking its address instantiates the kernel (the template values sgl-deep-gemm uses for 64 heads x 128, next_n 1)
extern "C" const void* dg_sm120_indexer_kernel() {
    return reinterpret_cast<const void*>(
        &deep_gemm::sm120_fp8_paged_mqa_logits<1, 64, 128, 64, false, false, 3, 3, 128, 128, 256, float>);
}
"""


def installed_include() -> str:
    spec = importlib.util.find_spec("deep_gemm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("deepgemm_sm120: no deep_gemm package on the path (install sgl-deep-gemm, or pass --include)")
    inc = os.path.join(list(spec.submodule_search_locations)[0], "include")
    if not os.path.isfile(os.path.join(inc, "deep_gemm", "impls", "sm120_tf32_hc_prenorm_gemm.cuh")):
        raise SystemExit(f"deepgemm_sm120: {inc} has no deep_gemm/impls/sm120_tf32_hc_prenorm_gemm.cuh "
                         f"(sgl-deep-gemm 0.1.5+ ships the SM120 kernels)")
    return inc


def relaxed_copy(include: str, dst: str) -> list:
    """Copy ``include`` to ``dst`` and relax the SM120 guards there; returns the files changed."""
    shutil.copytree(include, dst)
    changed = []
    for root, _, files in os.walk(os.path.join(dst, "deep_gemm")):
        for f in files:
            p = os.path.join(root, f)
            text = open(p, errors="replace").read()
            new = GUARD.sub("__CUDA_ARCH__ >= 900", text)
            if new != text:
                open(p, "w").write(new)
                changed.append(os.path.relpath(p, dst))
    return sorted(changed)


def nvcc(args, what):
    cmd = ["nvcc", "-std=c++17", "--expt-relaxed-constexpr", "-O3", "-arch=sm_90a", *args]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"deepgemm_sm120: nvcc ({what}) failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}")
    return time.time() - t0, r.stderr


def build(tmp: str, include: str, compile_only: bool) -> dict:
    inc = os.path.join(tmp, "include")
    changed = relaxed_copy(include, inc)
    out = {"include": include, "guards_relaxed": changed}
    lib = os.path.join(tmp, "libdg_sm120.so")
    secs, log = nvcc(["-Xcompiler", "-fPIC", "-shared", "-Xptxas", "-v", "-I", inc,
                      os.path.join(HERE, "deepgemm_sm120", "hc_prenorm_host.cu"), "-o", lib], "hc_prenorm")
    out["hc_prenorm_build_s"] = round(secs, 1)
    out["hc_prenorm_ptxas"] = sorted({l.strip() for l in log.splitlines() if "registers" in l})[:4]
    probe = os.path.join(tmp, "indexer_probe.cu")
    open(probe, "w").write(INDEXER_PROBE)
    secs, log = nvcc(["-c", "-Xptxas", "-v", "-I", inc, probe, "-o", os.path.join(tmp, "indexer_probe.o")], "indexer")
    out["indexer_compile_s"] = round(secs, 1)
    out["indexer_ptxas"] = sorted({l.strip() for l in log.splitlines() if "registers" in l})[:2]
    out["lib"] = lib
    return out


def run(lib_path: str, ms, report: dict) -> list:
    import torch

    sys.path.insert(0, ROOT)
    from deepseek_v4_kernel.bench import shapes
    from deepseek_v4_kernel.bench.timing import time_rotated
    from deepseek_v4_kernel.ops.hc_prenorm import hc_prenorm_gemm
    from deepseek_v4_kernel.reference.hc_prenorm import hc_prenorm_gemm_ref

    lib = ctypes.CDLL(lib_path)
    lib.dg_sm120_error.restype = ctypes.c_char_p
    lib.dg_sm120_hc_prenorm.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p]
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    K, N = shapes.HC_K, shapes.HC_N
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for m in ms:
        for splits in (1, shapes.sglang_mhc_splits(m, sms)):
            sets = []
            for _ in range(8):   # rotated sets (x is 32 KiB per row: 8 sets of m <= 256 stay near L2 for m 1)
                x = torch.randn(m, K, device=dev, generator=g).bfloat16()
                fn = torch.randn(N, K, device=dev, generator=g) * 0.05
                sets.append((x, fn, torch.full((splits, m, N), float("nan"), device=dev),
                             torch.full((splits, m), float("nan"), device=dev)))

            def dg(s):
                x, fn, d, sq = s

                def call():
                    if lib.dg_sm120_hc_prenorm(x.data_ptr(), fn.data_ptr(), d.data_ptr(), sq.data_ptr(), m, splits,
                                               torch.cuda.current_stream().cuda_stream) != 0:
                        raise RuntimeError(lib.dg_sm120_error().decode())
                    return d, sq
                return call

            def ours(s):
                x, fn, d, sq = s
                out = torch.empty_like(d)
                osq = torch.empty_like(sq)

                def call():
                    hc_prenorm_gemm(x, fn, out, osq, None if splits == 1 else splits)
                    return out, osq
                return call

            ref_out, ref_sq = hc_prenorm_gemm_ref(sets[0][0].cpu(), sets[0][1].cpu(), None)
            row = {"m": m, "splits": splits}
            for name, prep in (("deepgemm_sm120", dg), ("ours", ours)):
                try:
                    calls = [prep(s) for s in sets]
                    d, sq = calls[0]()
                    torch.cuda.synchronize()
                    got = d.reshape(-1, m, d.shape[-1]).sum(0)[:, :N].double().cpu()
                    gsq = sq.reshape(-1, m).sum(0).double().cpu()
                    err = max(float((got - ref_out).norm() / ref_out.norm()), float((gsq - ref_sq).norm() / ref_sq.norm()))
                    if not err < 0.01:   # tf32 products, fp32 sums: ~1e-3
                        row[name] = {"status": "wrong", "error": err}
                        continue
                    us, how = time_rotated(calls)
                    row[name] = {"status": "ok", "us": round(us, 2), "how": how, "error": err}
                except Exception as e:  # noqa: BLE001
                    row[name] = {"status": "failed", "reason": f"{type(e).__name__}: {str(e)[:200]}"}
            a, b = row.get("deepgemm_sm120", {}), row.get("ours", {})
            if a.get("us") and b.get("us"):
                row["deepgemm_over_ours"] = round(a["us"] / b["us"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--include", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--m", default="1,8,64,256")
    args = ap.parse_args(argv)
    include = args.include or installed_include()
    report = {}
    with tempfile.TemporaryDirectory(prefix="dg_sm120_") as tmp:
        report.update(build(tmp, include, args.compile_only))
        print(json.dumps({k: v for k, v in report.items() if k != "lib"}, indent=1), flush=True)
        if not args.compile_only:
            report["hc_prenorm"] = run(report["lib"], [int(x) for x in args.m.split(",")], report)
    report.pop("lib", None)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
