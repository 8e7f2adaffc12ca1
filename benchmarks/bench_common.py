"""Timing and floor measurements shared by the benchmarks (benchmarks/bench_*.py).

Every bench reports its speed against floors measured in the same run on the same GPU: copy
bandwidth (read + write of 1 GiB) and a dense matmul rate. On an H100 the matmul rate is a wgmma
rate, which no kernel of the mma.sync class (SM120's only tensor-core path) can reach; mma_sync_flops()
measures that class's own ceiling (benchmarks/mma_peak.cu).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


# the timing methods and floors shared with the user's `python -m deepseek_v4_kernel bench`
from deepseek_v4_kernel.bench.timing import (bf16_flops, capture_graph, copy_bw, fp8_flops,  # noqa: E402,F401
                                             kernel_times, timeit, timeit_graph)


def mma_sync_flops():
    """FLOP/s of mma.sync m16n8k16 bf16 (fp32 accumulate) with register operands on this GPU: the best of
    1..4 warps per scheduler in benchmarks/mma_peak.cu, built here with nvcc for the GPU at hand (-arch=native).
    None (and a printed reason) where nvcc is missing or the build or run fails."""
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    src = os.path.join(ROOT, "benchmarks", "mma_peak.cu")
    with tempfile.TemporaryDirectory() as d:
        exe, js = os.path.join(d, "mma_peak"), os.path.join(d, "mma_peak.json")
        try:
            subprocess.run([nvcc, "-O3", "-arch=native", src, "-o", exe], check=True, capture_output=True,
                           text=True, timeout=300)
            subprocess.run([exe, "--json", js], check=True, capture_output=True, text=True, timeout=120)
            rows = json.load(open(js))["rows"]
        except (OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
            err = getattr(e, "stderr", "") or ""
            print(f"mma.sync rate not measured ({type(e).__name__}: {str(e)[:120]} {err[-200:]})")
            return None
    best = max(r["tflops"] for r in rows if r["operands"] == "registers")
    return best * 1e12
