"""Compile fp4_moe's GEMM kernels ahead of time (no GPU needed) for sm_90 / sm_120 and report
shared memory, registers, spills and the MMA instructions used, per impl and tile config.

usage: python tools/aot_fp4_moe.py [--arch 120] [--json OUT.json]
Prints one JSON line per (kernel, impl, config) prefixed with "AOT".
"""
import argparse
import functools
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from deepseek_v4_kernel.ops import fp4_moe as op  # noqa: E402
from aot_common import divisibility_attrs, emit  # noqa: E402  (this directory is sys.path[0])

H, I = 4096, 2048


SMS = 188  # RTX PRO 6000 Blackwell: the split-K choice at 1 token on an SM120 card


def configs(impl, labels=("decode1", "decode", "mid", "prefill")):
    """(label, c1, c2) of the picked configs of impl at DSV4 shapes (E=256, topk 6), with the
    split-K that fp4_moe would choose (decode1 = 1 token: split)."""
    out = []
    for label, M in (("decode1", 1), ("decode", 32), ("mid", 1024), ("prefill", 8192)):
        if label not in labels:
            continue
        c1, c2 = op.dispatch._pick_config(M, 6, 256, I, H, impl)
        c1, c2 = op.dispatch._finish_config(c1, c2, I, H)
        max_blocks = op.max_row_blocks(M * 6, c1["BM"], 256)
        c1["SPLIT_K"] = op.split_k(max_blocks * triton.cdiv(I, c1["BN"]), H, c1["BK"], SMS)
        c2["SPLIT_K"] = 2 if label == "decode1" else 1   # fp4_moe splits gemm2 only on request
        for c, K in ((c1, H), (c2, I)):
            c["K_PER_SPLIT"] = op.k_per_split(K, c["BK"], c["SPLIT_K"])
        out.append((label, c1, c2))
    return out


def compile_one(kernel, impl, c, arch, scale_f32=False):
    ptrs1 = dict(x_ptr="*bf16", w_ptr="*i8", s_ptr="*fp32" if scale_f32 else "*u8", h_ptr="*bf16",
                 sorted_ptr="*i32", block_expert_ptr="*i32", start_ptr="*i32", counts_ptr="*i32")
    if kernel == "gemm1":
        fn = op.kernels._gemm1_kernel
        sig = dict(ptrs1)
        if c["SPLIT_K"] > 1:
            sig["h_ptr"] = "*fp32"
        ints = ["TOPK", "NUM_M", "stride_xm", "stride_we", "stride_wn", "stride_se", "stride_sn", "stride_hm"]
        sig.update({k: "i32" for k in ints})
        sig["limit"] = "fp32"
        sig["stride_ps"] = "i32"
        const = dict(HID=H, INTER=I, SCALE_F32=scale_f32, SWIGLU=True, SPLIT_K=c["SPLIT_K"])
        div = list(ptrs1) + ["stride_xm", "stride_we", "stride_wn", "stride_se", "stride_sn", "stride_hm"]
    else:
        fn = op.kernels._gemm2_kernel
        sig = dict(h_ptr="*bf16", w_ptr="*i8", s_ptr="*fp32" if scale_f32 else "*u8",
                   y_ptr="*fp32" if c["SPLIT_K"] > 1 else "*bf16",
                   tw_ptr="*fp32", sorted_ptr="*i32", block_expert_ptr="*i32", start_ptr="*i32",
                   counts_ptr="*i32")
        ints = ["NUM_M", "stride_hm", "stride_we", "stride_wn", "stride_se", "stride_sn", "stride_ym", "stride_ys"]
        sig.update({k: "i32" for k in ints})
        const = dict(HID=H, INTER=I, SCALE_F32=scale_f32)
        div = [k for k in sig if k.endswith("_ptr")] + ["stride_hm", "stride_we", "stride_wn", "stride_se",
                                                          "stride_sn", "stride_ym"]
    const.update(BM=c["BM"], BN=c["BN"], BK=c["BK"], GROUP_M=c["GROUP_M"], IMPL=op.dispatch._IMPL_CODE[impl],
                 INTERP=False, DEQ_PTX=impl == "dequant", K_PER_SPLIT=c["K_PER_SPLIT"])
    sig.update({k: "constexpr" for k in const})
    k = triton.compile(ASTSource(fn, sig, const, divisibility_attrs(fn, div)), target=GPUTarget("cuda", arch, 32),
                       options=dict(num_warps=c["num_warps"], num_stages=c["num_stages"]))
    ptx = k.asm["ptx"]
    return dict(shared=k.metadata.shared, n_regs=getattr(k, "n_regs", None),
                n_spills=getattr(k, "n_spills", None),
                mma_sync="mma.sync" in ptx, wgmma="wgmma" in ptx, tcgen05="tcgen05" in ptx,
                block_scale="block_scale" in ptx, mxf8f6f4="mxf8f6f4" in ptx, mxf4="mxf4" in ptx)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, action="append")
    ap.add_argument("--impls", default=",".join(op.IMPLS))
    ap.add_argument("--labels", default="decode1,decode,mid,prefill")
    ap.add_argument("--json")
    args = ap.parse_args()
    cases = []
    for arch in args.arch or [120]:
        for impl in args.impls.split(","):
            for label, c1, c2 in configs(impl, args.labels.split(",")):
                for kern, c in (("gemm1", c1), ("gemm2", c2)):
                    cases.append((dict(arch=arch, label=label, impl=impl, kernel=kern, config=c),
                                  functools.partial(compile_one, kern, impl, c, arch)))
    emit(cases, args.json)


if __name__ == "__main__":
    main()
