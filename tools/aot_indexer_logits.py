"""Compile the indexer-logits Triton kernels ahead of time (no GPU needed) for sm_120 (or another arch)
at every configuration DeepSeek-V4 can reach, and report shared memory, registers, spills and the
MMA instructions used. The H100 compiles the same source with wgmma and 227 KB of shared memory, so
only this compile says whether the tiles fit SM120 (101376 B per block, mma.sync only).

usage: python tools/aot_indexer_logits.py [--arch 120] [--json OUT.json]
Prints one JSON line per (kernel, shape) prefixed with "AOT".
"""
import argparse
import functools
import os
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from deepseek_v4_kernel.ops import indexer_logits as op  # noqa: E402
from aot_common import divisibility_attrs, emit, resource_usage  # noqa: E402  (this directory is sys.path[0])

HEADS = (16, 32, 64, 128)   # what the op accepts (DeepSeek-V4 Flash's indexer: 64)


def cases():
    """(kernel, next_n, heads, variant): paged at next_n 1..4 (decode, MTP verify) with 1-D and 2-D
    lengths, flat with absolute and relative (compressed) columns."""
    out = []
    for n in (1, 2, 3, 4):
        for h in HEADS:
            if n * h > 256 and op._next_pow2(n) * h > 256:
                continue   # the op runs it as rows of next_n = 1 (compiled below as n = 1)
            for lens_2d in (False, True) if n > 1 else (False,):
                out.append(("paged", n, h, "lens_2d" if lens_2d else "lens_1d"))
    for h in HEADS:
        for rel in (False, True):
            out.append(("flat", 0, h, "relative" if rel else "absolute"))
    return out


def compile_one(kernel, n, h, variant, arch):
    if kernel == "paged":
        fn = op._paged_kernel
        NP, block_t, num_warps, num_stages = op.paged_config(n, h)
        sig = dict(q_ptr="*fp8e4nv", kv8_ptr="*fp8e4nv", kv32_ptr="*fp32", w_ptr="*fp32", len_ptr="*i32",
                   bt_ptr="*i32", out_ptr="*fp32")
        sig.update({k: "i32" for k in ("stride_qb", "stride_qn", "stride_qh", "stride_wr", "stride_lb",
                                       "stride_ln", "stride_btb", "stride_or", "max_context_len", "chunk",
                                       "max_blocks", "num_blocks")})
        const = dict(NEXT_N=n, NP=NP, H=h, D=128, BLOCK_T=block_t, LENS_2D=variant == "lens_2d", CLEAN=True,
                     NUM_STAGES=num_stages, INTERPRET=False, BT_GROUP=1)
        div = [k for k in sig if k.endswith("_ptr")] + ["stride_qb", "stride_qn", "stride_qh", "stride_wr",
                                                          "stride_btb", "stride_or", "chunk"]
    else:
        fn = op._flat_kernel
        BR, block_t, num_warps, num_stages = op.flat_config(h)
        rel = variant == "relative"
        sig = dict(q_ptr="*fp8e4nv", k_ptr="*fp8e4nv", ks_ptr="*fp32", w_ptr="*fp32", kst_ptr="*i32",
                   ke_ptr="*i32", out_ptr="*fp32")
        sig.update({k: "i32" for k in ("rows", "n_kv", "width", "chunk", "stride_qr", "stride_qh",
                                       "stride_kn", "stride_sn", "stride_wr", "stride_or")})
        const = dict(BR=BR, H=h, D=128, BLOCK_T=block_t, RELATIVE=rel, CLEAN=not rel,
                     NUM_STAGES=num_stages, INTERPRET=False)
        div = [k for k in sig if k.endswith("_ptr")] + ["stride_qr", "stride_qh", "stride_kn", "stride_wr",
                                                          "stride_or", "chunk"]
    sig.update({k: "constexpr" for k in const})
    k = triton.compile(ASTSource(fn, sig, const, divisibility_attrs(fn, div)), target=GPUTarget("cuda", arch, 32),
                       options=dict(num_warps=num_warps, num_stages=num_stages))
    ptx = k.asm["ptx"]
    rec = dict(shared=k.metadata.shared, num_warps=num_warps, num_stages=num_stages, block_t=block_t,
               target=(re.search(r"\.target (\S+)", ptx) or [None, None])[1],
               mma_sync="mma.sync" in ptx, fp8_mma="e4m3.e4m3" in ptx, wgmma="wgmma" in ptx,
               tcgen05="tcgen05" in ptx)
    rec.update(resource_usage(k.asm["cubin"]))
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=120)
    ap.add_argument("--json")
    args = ap.parse_args()
    emit([(dict(arch=args.arch, kernel=kernel, next_n=n, heads=h, variant=variant),
           functools.partial(compile_one, kernel, n, h, variant, args.arch))
          for kernel, n, h, variant in cases()], args.json)


if __name__ == "__main__":
    main()
