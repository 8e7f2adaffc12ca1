"""``python -m deepseek_v4_kernel bench [--tp N] [--ops a,b] [--out PATH] [--quick] [--mma-sync] ...``

Times each op, ours against every SGLang path installed here that runs on this GPU (FlashInfer's SM120 kernels
on SM120, the TileLang kernels where tilelang is installed, DeepSeek's own kernels where they run), at
DeepSeek-V4-Flash shapes for the TP size, prints one table and writes the JSON that DSV4_KERNEL_PREFER=measured
reads (default path: patch/measured.default_path, shown by the doctor). Progress goes to stderr.
"""

from __future__ import annotations

import os
import sys
import time
from typing import List, Optional

from . import shapes

USAGE = ("usage: python -m deepseek_v4_kernel bench [--tp {1,2,4,8}] [--ops " + ",".join(shapes.OPS) + "] "
         "[--out PATH] [--quick] [--mma-sync] [--no-pad] [--allow-jit] [--floor] [--sglang-sources V[,V]]")


class UsageError(ValueError):
    """A bad command-line argument (the message names it and what it expects)."""


def parse_args(argv: List[str]) -> dict:
    """The options as a dict; UsageError names the argument and the expected value."""
    opts = dict(tp=1, ops=list(shapes.OPS), out=None, quick=False, mma_sync=False, pad=True, allow_jit=False,
                floor=False, sglang_sources=(), help=False)
    flags = {"--quick": "quick", "--mma-sync": "mma_sync", "--allow-jit": "allow_jit", "--floor": "floor"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, inline = arg.partition("=")
        if arg in ("-h", "--help"):
            opts["help"] = True
            i += 1
            continue
        if arg in flags:
            opts[flags[arg]] = True
            i += 1
            continue
        if arg == "--no-pad":
            opts["pad"] = False
            i += 1
            continue
        if key not in ("--tp", "--ops", "--out", "--sglang-sources"):
            raise UsageError(f"unknown argument {arg!r}; {USAGE}")
        if eq:
            value = inline
            i += 1
        else:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise UsageError(f"{key} needs a value ({_expects(key)})")
            value = argv[i + 1]
            i += 2
        if key == "--tp":
            try:
                tp = int(value)
            except ValueError:
                raise UsageError(f"--tp must be one of 1, 2, 4, 8 (the tensor-parallel size), got {value!r}") from None
            try:
                opts["tp"] = shapes.check_tp(tp)
            except ValueError:
                raise UsageError(f"--tp must be one of 1, 2, 4, 8 (DeepSeek-V4-Flash's 64 heads split evenly over "
                                 f"the ranks), got {value!r}") from None
        elif key == "--ops":
            if not value.strip():
                raise UsageError(f"--ops must be a comma-separated subset of {','.join(shapes.OPS)}, got ''")
            try:
                opts["ops"] = shapes.parse_ops(value)
            except ValueError as e:
                raise UsageError(str(e)) from None
        elif key == "--out":
            if not value.strip():
                raise UsageError("--out must be a file path (where the JSON goes), got ''")
            opts["out"] = value
        else:
            versions = tuple(v.strip() for v in value.split(",") if v.strip())
            bad = [v for v in versions if not all(p.isdigit() or p.startswith("post") for p in v.split("."))]
            if not versions or bad:
                raise UsageError(f"--sglang-sources must be SGLang versions like 0.5.23[,0.5.17], got {value!r}")
            opts["sglang_sources"] = versions
    return opts


def _expects(key: str) -> str:
    return {"--tp": "one of 1, 2, 4, 8", "--ops": "a comma-separated subset of " + ",".join(shapes.OPS),
            "--out": "a file path", "--sglang-sources": "SGLang versions like 0.5.23,0.5.17"}[key]


def _log(msg: str, t0=[None]) -> None:  # noqa: B006  (the run's start time)
    if t0[0] is None:
        t0[0] = time.time()
    print(f"[bench {time.time() - t0[0]:6.1f}s] {msg}", file=sys.stderr, flush=True)


def run(opts: dict, log=_log) -> dict:
    """Measure and return the JSON document (not written)."""
    if opts["mma_sync"]:
        # Triton reads it when it compiles a kernel: every kernel of this process is then an mma.sync build (the
        # class SM120 runs); TileLang gets TL_DISABLE_WGMMA through bench/competitors.py.
        os.environ["DISABLE_MMA_V3"] = "1"
    import torch

    from .. import __version__
    from ..patch import policy
    from . import inputs, report, runner
    from .timing import copy_bw, l2_bytes

    if not torch.cuda.is_available():
        raise RuntimeError("bench needs a CUDA GPU: torch.cuda.is_available() is False")
    gpu = report.gpu_info()
    # the name the patch layer sees in a worker (NVML, no CUDA context) is the one measured.py matches
    nvml = policy.device_info()
    gpu["nvml_name"] = nvml.names[0] if nvml.names else gpu["name"]
    vers = report.versions()
    log(f"{gpu['name']} sm_{gpu['capability'][0]}{gpu['capability'][1]}, {gpu['sm_count']} SMs, "
        f"L2 {gpu['l2_bytes'] >> 20} MiB; TP {opts['tp']}; "
        + ", ".join(f"{k} {v}" for k, v in vers.items() if v) + ("; mma.sync builds" if opts["mma_sync"] else ""))
    opt = runner.Options(tp=opts["tp"], ops=opts["ops"], quick=opts["quick"], mma_sync=opts["mma_sync"],
                         pad=opts["pad"], allow_jit=opts["allow_jit"], source_versions=opts["sglang_sources"],
                         hc_impls=tuple(opts.get("hc_impls", ())))
    if opts["floor"]:
        opt.floor_bw = copy_bw()
        log(f"copy bandwidth {opt.floor_bw / 1e12:.2f} TB/s (read + write of 1 GiB): the byte floor's rate")
    pools = inputs.Pools(torch.device("cuda", torch.cuda.current_device()), l2_bytes())
    ops = {}
    for op in opt.ops:
        log(f"{op}: discovering competitors")
        ops[op] = runner.run_op(op, opt, pools, log, gpu["sm_count"], policy.sglang_version())
    options = {k: opts[k] for k in ("quick", "mma_sync", "pad", "allow_jit")}
    options["sglang_sources"] = list(opts["sglang_sources"])
    return report.build(gpu, vers, opts["tp"], options, ops, __version__)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts = parse_args(argv)
    except UsageError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    if opts["help"]:
        print(USAGE)
        print(__doc__)
        return 0
    from ..patch import measured
    from . import report

    t0 = time.time()
    try:
        doc = run(opts)
    except RuntimeError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    path = opts["out"] or measured.default_path(doc["gpu"]["nvml_name"], tuple(doc["gpu"]["capability"]), doc["tp"])
    print(report.table(doc))
    report.write(doc, path)
    print(f"wrote {path} ({time.time() - t0:.0f} s); DSV4_KERNEL_PREFER=measured reads it "
          f"(python -m deepseek_v4_kernel doctor shows what it decides)")
    return 0
