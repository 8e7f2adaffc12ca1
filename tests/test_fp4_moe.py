"""fp4_moe (MXFP4 routed experts): the packer, the float64 reference, the Triton kernels in interpreter mode on the
CPU (on the GPU otherwise), and the argument checks. GPU-only kernel tests: test_fp4_moe_gpu.py; dispatch rules:
test_fp4_moe_dispatch.py.

Tolerance (exact-weight impls "dequant" and "dot_scaled"): weights are used exactly, x is
bf16 (exact), products accumulate in fp32; what rounds is h = silu(g)*u -> bf16, each
routed row y*w -> bf16 and the output -> bf16 (2^-9 relative each, round to nearest; the
CPU interpreter keeps h and y in fp32 but its final cast truncates, 2^-8). All three are
bounded by A = rsf * sum_k |w_k| * (|h_k| @ |W2_e|^T) (float64), so per element
|out - ref| <= 2^-7 * A (= 4 * 2^-9 * A, with room for the fp32 sums and exp).
"mxfp8" rounds activations to e4m3 as well; it is compared with the reference that models
that rounding (act_quant="mxfp8") under the same bound (its h may differ from the
kernel's by one bf16 ulp, which can move a few e4m3 roundings: covered by the 2^-7 A).
"""
import os

import pytest
import torch

from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.reference.fp4_moe import (E2M1_VALUES, dequantize_mxfp4,
                                                   fp4_moe_reference, quantize_act_mxfp8,
                                                   quantize_mxfp4, unpack_e2m1)

from fp4_moe_cases import make_routing, make_weights, run_and_check

from deepseek_v4_kernel.ops import fp4_moe as op

HAS_E8M0 = hasattr(torch, "float8_e8m0fnu")


# ----------------------------------------------------------------------------- packer (CPU)
def test_nibble_order_and_scale_meaning():
    # byte 0x21: low nibble 1 (= 0.5) is element 0, high nibble 2 (= 1.0) element 1;
    # 0xF8: low 8 (-0.0), high 15 (-6.0). Scale bits 128 -> x2, 126 -> x0.5.
    packed = torch.tensor([[0x21] * 16, [0xF8] * 16], dtype=torch.uint8)
    v = unpack_e2m1(packed)
    assert v[0, :2].tolist() == [0.5, 1.0] and v[1, :2].tolist() == [-0.0, -6.0]
    s = torch.tensor([[128], [126]], dtype=torch.uint8)
    d = dequantize_mxfp4(packed, s)
    assert d[0, :2].tolist() == [1.0, 2.0] and d[1, :2].tolist() == [0.0, -3.0]
    # the int8 view SGLang keeps (torch.int8 parameters) reads the same
    assert torch.equal(unpack_e2m1(packed.view(torch.int8)), v)
    assert list(E2M1_VALUES[:8]) == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.mark.parametrize("scale_dtype", [torch.uint8, torch.float32]
                         + ([torch.float8_e8m0fnu] if HAS_E8M0 else []))
def test_packer_round_trip(scale_dtype):
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(48, 256, generator=g) * torch.exp2(torch.randint(-20, 5, (48, 1), generator=g).float()))
    w[3, :32] = 0.0  # an all-zero group
    w = w.bfloat16()
    p, s = quantize_mxfp4(w, scale_dtype)
    assert p.dtype == torch.uint8 and tuple(p.shape) == (48, 128)
    assert s.dtype == scale_dtype and tuple(s.shape) == (48, 8)
    d = dequantize_mxfp4(p, s)
    wd = w.double()
    # every group: max |value| fits (scale >= amax/6) and the scale is the smallest such
    gs = dequantize_mxfp4(torch.full_like(p, 0x77), s)  # 6 * scale per element
    amax = wd.unflatten(-1, (-1, 32)).abs().amax(-1).repeat_interleave(32, -1)
    assert (amax <= gs).all() and ((amax > gs / 2) | (amax == 0)).all()
    # each element is a nearest grid point: |w - d| <= half the local spacing (<= scale)
    step = gs / 6
    assert ((wd - d).abs() <= step + 1e-30).all()
    assert (d[3, :32] == 0).all()
    # grid values survive a second round trip exactly (the scale may halve when the group
    # maximum rounded down to 3 * scale; the values stay representable)
    p2, s2 = quantize_mxfp4(d.float(), scale_dtype)
    assert torch.equal(dequantize_mxfp4(p2, s2), d)


def test_packer_ties_to_even():
    # 32 values on midpoints of the grid (scale 1: amax 6 is present)
    vals = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] * 4)
    p, s = quantize_mxfp4(vals[None])
    d = dequantize_mxfp4(p, s)[0, :8].tolist()
    assert d == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert int(s[0, 0]) == 127


def test_reference_matches_per_token_loop():
    """The reference's grouped form equals a naive per-(token, slot) loop."""
    M, H, I, E, k = 5, 64, 32, 6, 3
    w13, s13, w2, s2 = make_weights(E, H, I, "cpu")
    tw, ids = make_routing(M, E, k, "cpu", drop=0.2)
    x = torch.randn(M, H).bfloat16()
    ref = fp4_moe_reference(x, w13, s13, w2, s2, tw, ids, swiglu_limit=0.05,
                            routed_scaling_factor=1.5)
    naive = torch.zeros(M, H, dtype=torch.float64)
    for t in range(M):
        for j in range(k):
            e = int(ids[t, j])
            if e < 0:
                continue
            W13 = dequantize_mxfp4(w13[e], s13[e])
            g, u = (x[t].double() @ W13.T).split(I)
            g, u = g.clamp(max=0.05), u.clamp(-0.05, 0.05)
            h = torch.nn.functional.silu(g) * u
            naive[t] += 1.5 * tw[t, j].double() * (h @ dequantize_mxfp4(w2[e], s2[e]).T)
    torch.testing.assert_close(ref, naive, rtol=1e-12, atol=1e-15)


def test_mxfp8_act_rounding_reference():
    x = torch.tensor([[1.0, -300.0, 3.0e-3] + [0.0] * 29 + [0.0] * 32], dtype=torch.float64)
    q = quantize_act_mxfp8(x)
    # group 0: amax 300 -> ceil(log2 300) = 9 -> scale 2^(9-8) = 2; 300/2 = 150 lies between
    # the e4m3 neighbours 144 and 160 -> 144 -> -288; 1/2 is exact; 3e-3/2 -> 2^-9 (subnormal)
    assert q[0, 0] == 1.0 and q[0, 1] == -288.0 and q[0, 2] == 2.0 ** -8
    assert (q[0, 32:] == 0).all()


# ----------------------------------------------------------------------------- kernel (interpreter on CPU, GPU otherwise)
CPU_CASES = [
    # M, H, I, E, topk, drop, skew, swiglu, rsf, scale dtype
    (1, 64, 32, 4, 2, 0.0, False, None, None, torch.uint8),
    (5, 96, 64, 6, 3, 0.25, False, 0.02, 1.5, torch.float32),
    (9, 64, 96, 10, 6, 0.1, True, None, 2.5, torch.uint8),
    (4, 64, 32, 16, 8, 0.0, True, 0.01, None, "e8m0"),
]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: f"M{c[0]}H{c[1]}I{c[2]}E{c[3]}k{c[4]}")
def test_tiny(device, case):
    M, H, I, E, k, drop, skew, lim, rsf, sdt = case
    if sdt == "e8m0":
        if not HAS_E8M0:
            pytest.skip("torch without float8_e8m0fnu")
        sdt = torch.float8_e8m0fnu
    w = make_weights(E, H, I, device, sdt, seed=M)
    tw, ids = make_routing(M, E, k, device, seed=M, drop=drop, skew=skew)
    x = (torch.randn(M, H, generator=torch.Generator().manual_seed(M)) * 2).bfloat16().to(device)
    run_and_check(x, w, tw, ids, swiglu_limit=lim, rsf=rsf, use_out=(M % 2 == 1))


def test_large_route_path_and_tokens_without_experts(device):
    """> SMALL_ROUTE_MAX_SLOTS slots: the atomic count + layout path; some tokens fully dropped."""
    M, H, I, E, k = 70, 64, 32, 8, 8
    assert M * k > op.SMALL_ROUTE_MAX_SLOTS
    w = make_weights(E, H, I, device)
    tw, ids = make_routing(M, E, k, device, seed=3, drop=0.3, skew=True)
    ids[:3] = -1
    ids[5, 2] = E + 4  # out of range: dropped like -1 (EP mapping)
    x = torch.randn(M, H).bfloat16().to(device)
    run_and_check(x, w, tw.bfloat16(), ids.int(), rsf=1.5)


def test_empty_batch(device):
    w = make_weights(2, 64, 32, device)
    x = torch.empty(0, 64, dtype=torch.bfloat16, device=device)
    ids = torch.empty(0, 2, dtype=torch.int32, device=device)
    out = op.fp4_moe(x, *w, torch.empty(0, 2, device=device), ids)
    assert tuple(out.shape) == (0, 64)


def test_config_override(device):
    M, H, I, E, k = 6, 128, 64, 4, 2
    w = make_weights(E, H, I, device)
    tw, ids = make_routing(M, E, k, device)
    x = torch.randn(M, H).bfloat16().to(device)
    cfg = {"gemm1": {"BN": 16, "BK": 64}, "gemm2": {"BN": 64, "BK": 32, "GROUP_M": 2}}
    run_and_check(x, w, tw, ids, config=cfg)
    with pytest.raises(UnsupportedCase, match="config"):
        op.fp4_moe(x, *w, tw, ids, config={"gemm1": {"BN": 24}})


@pytest.mark.parametrize("sk1,sk2,swiglu", [(2, 1, None), (1, 3, 0.02), (4, 2, 0.02), (8, 8, None)])
def test_split_k(device, sk1, sk2, swiglu):
    """K split over grid axis 1: gemm1 partials finished by _swiglu_kernel (clamp after the sum),
    gemm2 partials summed in _reduce_kernel; 8 splits of 2 (gemm1) / 1 (gemm2) K steps leave
    splits with no step at all (they must add zeros). Odd I, dropped slots, rsf."""
    M, H, I, E, k = 5, 64, 96, 6, 3
    w = make_weights(E, H, I, device, seed=11)
    tw, ids = make_routing(M, E, k, device, seed=11, drop=0.2)
    x = (torch.randn(M, H, generator=torch.Generator().manual_seed(11)) * 3).bfloat16().to(device)
    cfg = {"gemm1": {"BK": 32, "SPLIT_K": sk1}, "gemm2": {"BK": 32, "SPLIT_K": sk2}}
    run_and_check(x, w, tw, ids, swiglu_limit=swiglu, rsf=1.5, config=cfg)
    assert op.LAST_KERNELS["split_k"] == (sk1, sk2)
    with pytest.raises(UnsupportedCase, match="SPLIT_K"):
        op.fp4_moe(x, *w, tw, ids, config={"gemm2": {"SPLIT_K": 0}})



# ----------------------------------------------------------------------------- error messages (CPU)
def _args(device="cpu"):
    w13, s13, w2, s2 = make_weights(2, 64, 32, device)
    tw, ids = make_routing(3, 2, 2, device)
    x = torch.randn(3, 64).bfloat16().to(device)
    return dict(hidden_states=x, w13=w13, w13_scale=s13, w2=w2, w2_scale=s2,
                topk_weights=tw, topk_ids=ids)


@pytest.mark.parametrize("arg,bad,pattern", [
    ("hidden_states", lambda a: a.float(), r"hidden_states must be bf16 \[M, hidden\], got torch.float32"),
    ("hidden_states", lambda a: a[:, :32], r"w13 must be \[E, 2I, hidden/2\]"),
    ("w13", lambda a: a.float(), r"w13 must be int8/uint8 packed e2m1"),
    ("w2", lambda a: a[:, :, :8], r"w2 must be \[E, hidden, I/2\] = \[2, 64, 16\], got \[2, 64, 8\]"),
    ("w13_scale", lambda a: a.to(torch.int32), r"w13_scale must be uint8/float8_e8m0fnu/float32 \[2, 64, 2\], got torch.int32"),
    ("w2_scale", lambda a: a[:, :32], r"w2_scale must be .* \[2, 64, 1\], got torch.uint8 \[2, 32, 1\]"),
    ("topk_ids", lambda a: a.float(), r"topk_ids must be int32/int64 \[M=3, k>=1\], got torch.float32"),
    ("topk_ids", lambda a: a[:2], r"topk_ids must be int32/int64 \[M=3"),
    ("topk_weights", lambda a: a[:, :1], r"topk_weights must be float32/bf16/fp16 \[M=3, k=2\], got torch.float32 \[3, 1\]"),
    ("w13_scale", lambda a: a.transpose(1, 2).contiguous().transpose(1, 2), r"w13_scale must have unit stride"),
])
def test_errors_name_the_argument(arg, bad, pattern):
    a = _args()
    a[arg] = bad(a[arg])
    with pytest.raises(UnsupportedCase, match=r"^fp4_moe: " + pattern):
        op.fp4_moe(**a)


def test_errors_impl_and_out():
    a = _args()
    with pytest.raises(UnsupportedCase, match=r"fp4_moe: impl must be one of"):
        op.fp4_moe(**a, impl="cutlass")
    with pytest.raises(UnsupportedCase, match=r"fp4_moe: out must be bf16 \[M, hidden\] = \[3, 64\]"):
        op.fp4_moe(**a, out=torch.empty(3, 64))
    assert issubclass(UnsupportedCase, ValueError)
    # the compiled decode kernels: hidden 64 is no multiple of 128 (and on CPU there is no CUDA device)
    with pytest.raises(UnsupportedCase, match=r"^fp4_moe: impl 'cuda_decode': (needs a CUDA device|hidden)"):
        op.fp4_moe(**a, impl="cuda_decode")
    with pytest.raises(UnsupportedCase, match=r"^fp4_moe: impl 'cuda_stream': (needs a CUDA device|hidden)"):
        op.fp4_moe(**a, impl="cuda_stream")
    with pytest.raises(UnsupportedCase, match=r"^fp4_moe: config 'stream' applies to impl 'cuda_stream' only"):
        op.fp4_moe(**a, impl="dequant", config={"stream": {"variant": 1}})


def test_decode_limits_match_the_c_abi():
    """DECODE_MAX_SLOTS / DECODE_GEMM2_TILE are csrc/fp4_moe/params.h's, not second numbers, and the
    ctypes mirror lists params.h's fields in order (the loader also compares the struct sizes)."""
    import re

    from c_headers import header, struct_fields
    from deepseek_v4_kernel._ext import Fp4MoeDecodeParams

    src = header("fp4_moe")
    assert int(re.search(r"#define DSV4_FP4_MOE_MAX_SLOTS (\d+)", src).group(1)) == op.DECODE_MAX_SLOTS
    assert int(re.search(r"#define DSV4_FP4_MOE_GEMM2_TILE (\d+)", src).group(1)) == op.DECODE_GEMM2_TILE
    assert struct_fields(src, "Fp4MoeDecodeParams") == [f[0] for f in Fp4MoeDecodeParams._fields_]
    assert op.CUDA_DECODE_DEFAULT_SLOTS <= op.DECODE_MAX_SLOTS
    from deepseek_v4_kernel._ext import Fp4MoeStreamParams
    assert int(re.search(r"#define DSV4_FP4_MOE_STREAM_MAX_SLOTS (\d+)", src).group(1)) == op.STREAM_MAX_SLOTS
    assert int(re.search(r"#define DSV4_FP4_MOE_STREAM_MAX_EXPERTS (\d+)", src).group(1)) == op.STREAM_MAX_EXPERTS
    assert struct_fields(src, "Fp4MoeStreamParams") == [f[0] for f in Fp4MoeStreamParams._fields_]
    assert op.CUDA_STREAM_DEFAULT_SLOTS <= op.STREAM_MAX_SLOTS
    # the rows / K step the host rule assumes are the kernel's (kGemm1Rows = 8 kTiles, kGemm2Rows = 16 kTiles)
    kern = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc", "fp4_moe",
                             "kernel.cuh")).read()
    assert "constexpr int kTiles = 2;" in kern and "constexpr int kStepK = 128;" in kern
    assert (op.dispatch.STREAM_GEMM1_ROWS, op.dispatch.STREAM_GEMM2_ROWS, op.dispatch.STREAM_STEP_K) == (16, 32, 128)


def test_signature_is_stable():
    import inspect

    params = list(inspect.signature(op.fp4_moe).parameters)
    assert params[:11] == ["hidden_states", "w13", "w13_scale", "w2", "w2_scale", "topk_weights",
                           "topk_ids", "swiglu_limit", "routed_scaling_factor", "impl", "out"]
