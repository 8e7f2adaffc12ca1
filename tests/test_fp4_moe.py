"""fp4_moe (MXFP4 routed experts) vs the float64 reference, plus the MXFP4 packer.

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

from aot_errors import skip_or_fail
from fuzz import SEEDS, SM_COUNTS, named, patch_sm_count, replay_on_poisoned

from deepseek_v4_kernel.ops import fp4_moe as op

HAS_CUDA = torch.cuda.is_available()
HAS_E8M0 = hasattr(torch, "float8_e8m0fnu")


# ----------------------------------------------------------------------------- helpers
def make_weights(E, H, I, device, scale_dtype=torch.uint8, seed=0):
    """Real-valued bf16 weights (row scales spread over several binades) -> MXFP4."""
    g = torch.Generator(device=device).manual_seed(seed)
    p13, s13, p2, s2 = [], [], [], []
    for e in range(E):  # per expert: bounded peak memory at real sizes
        w13 = torch.randn(2 * I, H, device=device, generator=g) * 0.02
        w13 *= torch.exp2(torch.randint(-2, 3, (2 * I, 1), device=device, generator=g).float())
        w2 = torch.randn(H, I, device=device, generator=g) * 0.02
        a, b = quantize_mxfp4(w13.bfloat16(), scale_dtype)
        c, d = quantize_mxfp4(w2.bfloat16(), scale_dtype)
        p13.append(a), s13.append(b), p2.append(c), s2.append(d)
    return torch.stack(p13), torch.stack(s13), torch.stack(p2), torch.stack(s2)


def make_routing(M, E, topk, device, seed=0, drop=0.0, skew=False):
    """Distinct experts per token (like a real top-k), optional -1 slots; with skew, most
    tokens go to a few experts (ragged counts, many experts without tokens)."""
    g = torch.Generator().manual_seed(seed)
    if skew:
        w = torch.exp2(-torch.arange(E, dtype=torch.float64) / 2)
        ids = torch.stack([torch.multinomial(w, topk, replacement=False, generator=g)
                           for _ in range(M)])
    else:
        ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)])
    if drop > 0:
        ids[torch.rand(M, topk, generator=g) < drop] = -1
    tw = torch.rand(M, topk, generator=g) + 0.05
    return tw.to(device), ids.to(device)


def bound(x, w13, s13, w2, s2, tw, ids, swiglu_limit, rsf, act_quant=None):
    """A = rsf * sum_k |w_k| (|h_k| @ |W2_e|^T) in float64 (see the module docstring)."""
    xd = x.double()
    if act_quant:
        xd = quantize_act_mxfp8(xd)
    A = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64, device=x.device)
    inter = w2.shape[2] * 2
    for e in torch.unique(ids).tolist():
        if e < 0 or e >= w13.shape[0]:
            continue
        t, k = torch.nonzero(ids == e, as_tuple=True)
        gu = xd[t] @ dequantize_mxfp4(w13[e], s13[e]).T
        gg, u = gu[:, :inter], gu[:, inter:]
        if swiglu_limit is not None:
            gg, u = gg.clamp(max=swiglu_limit), u.clamp(-swiglu_limit, swiglu_limit)
        h = (gg * torch.sigmoid(gg) * u).abs()
        A.index_add_(0, t, (h @ dequantize_mxfp4(w2[e], s2[e]).abs().T) * tw[t, k].double().abs()[:, None])
    return A * (1.0 if rsf is None else abs(rsf))


def run_and_check(x, w, tw, ids, impl=None, swiglu_limit=None, rsf=None, use_out=True,
                  config=None, expect_impl=None):
    """One call against the float64 reference. ``expect_impl`` (with impl None): the impl the default dispatch must
    pick, checked against the one that ran."""
    w13, s13, w2, s2 = w
    M, H = x.shape
    out = None
    if use_out:
        out = torch.full((M, H), float("nan"), dtype=torch.bfloat16, device=x.device)
    res = op.fp4_moe(x, w13, s13, w2, s2, tw, ids, swiglu_limit=swiglu_limit,
                     routed_scaling_factor=rsf, impl=impl, out=out, config=config)
    if use_out:
        assert res is out
    assert res.dtype == torch.bfloat16 and tuple(res.shape) == (M, H)
    assert not torch.isnan(res).any(), "not every output element was written"
    if expect_impl is not None:
        ran = op.LAST_KERNELS["config"][2]
        assert ran == expect_impl, f"the default dispatch ran {ran!r}, the rule says {expect_impl!r}"
        impl = ran
    aq = "mxfp8" if (impl == "mxfp8" and not op.dispatch._interp()) else None
    ref = fp4_moe_reference(x, w13, s13, w2, s2, tw, ids, swiglu_limit=swiglu_limit,
                            routed_scaling_factor=rsf, act_quant=aq)
    A = bound(x, w13, s13, w2, s2, tw, ids, swiglu_limit, rsf, act_quant=aq)
    err = (res.double() - ref).abs()
    tol = 2.0 ** -7 * A + 1e-30
    bad = err > tol
    assert not bad.any(), (f"{int(bad.sum())} elements off; worst err/tol "
                           f"{float((err / tol).max()):.3g}, max|ref| {float(ref.abs().max()):.3g}")
    # dropped / unrouted tokens give exact zeros
    none = ((ids < 0) | (ids >= w13.shape[0])).all(1)
    if none.any():
        assert (res[none] == 0).all()
    return res


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


def test_split_k_rule():
    """Shapes only: split while the grid is under SPLIT_PROGRAMS_PER_SM per SM, >= 2 K steps each."""
    assert op.split_k(384, 4096, 128, 132) == 4      # 1 token, gemm1 on an H100
    assert op.split_k(768, 2048, 128, 132) == 2      # the rule alone (gemm2 uses it only on request)
    assert op.split_k(3264, 4096, 128, 132) == 1     # 8 tokens: enough programs already
    assert op.split_k(10, 256, 128, 132) == 1        # one K step per split would be left
    assert op.split_k(1, 1 << 20, 128, 1000) == op.MAX_SPLIT_K


def test_stream_default_variant_rule():
    """The default variant (dispatch.stream_default_variant, measured on an H200): the 4-block register ring up to 24
    slots (4 tokens at top-6) and wherever shared memory cannot hold four 52 KB blocks per SM (SM120's 100 KB); the
    4-block shared-memory ring with two MMA chains above 24 slots on 228 KB GPUs (H100 / H200)."""
    d = op.dispatch
    assert d.STREAM_DEFAULT_VARIANT is None
    assert [d.stream_default_variant(S, 228) for S in (6, 24, 25, 48, 1536)] == [1, 1, 5, 5, 5]
    assert [d.stream_default_variant(S, 100) for S in (6, 24, 25, 1536)] == [1, 1, 1, 1]
    assert d.stream_default_variant(96) == 1                     # unknown shared memory: the small-memory choice
    assert d.stream_plan(16, 6, 256, 4096, 2048, 132, None, 228)["variant"] == 5
    assert d.stream_plan(16, 6, 256, 4096, 2048, 188, None, 100)["variant"] == 1
    assert d.stream_plan(16, 6, 256, 4096, 2048, 132, {"variant": 0}, 228)["variant"] == 0


def test_stream_plan_rule():
    """Shapes only (docs/fp4_moe.md section 4): the fewest warps per item (1, 2, 4) that give every warp of the
    grid >= STREAM_BALANCE items, at most the K steps; DeepSeek-V4-Flash (E 256, top-6, hidden 4096) on 132 SMs."""
    plan = op.dispatch.stream_plan
    assert op.dispatch.stream_items_bound(6, 256, 128) == 768          # 1 token: 6 experts x 128 row tiles
    assert op.dispatch.stream_items_bound(48, 256, 128) == (48 + 6) * 128
    assert op.dispatch.stream_items_bound(1536, 256, 128) == (256 + 192) * 128
    V0 = {"variant": 0}
    # variant 0: 3 blocks x 4 warps per SM = 1584 warps; 1 token: 768 items -> 4 warps each (3072 < 3168 still)
    assert plan(1, 6, 256, 4096, 2048, 132, V0) == {"variant": 0, "blocks_per_sm": 0, "wpi1": 4, "wpi2": 4}
    assert plan(2, 6, 256, 4096, 2048, 132, V0)["wpi1"] == 2               # 13 passes x 128 x 2 >= 3168
    assert plan(8, 6, 256, 4096, 2048, 132, V0)["wpi1"] == 1
    # TP 8 (I = 256): gemm2's K is 2 steps, so at most 2 warps per item
    assert plan(1, 6, 256, 4096, 256, 132, V0)["wpi2"] == 2
    assert plan(1, 6, 256, 4096, 256, 132, V0)["wpi1"] == 4
    # variant 1 (4 blocks per SM) has more warps to feed: 2 tokens need 4 warps per item there
    assert plan(2, 6, 256, 4096, 2048, 132, {"variant": 1})["wpi1"] == 4
    # a smaller card (24 SMs) reaches 1 warp per item sooner
    assert plan(2, 6, 256, 4096, 2048, 24, V0)["wpi1"] == 1
    assert plan(1, 6, 256, 4096, 2048, 132, {"variant": 0, "wpi1": 2, "blocks_per_sm": 1}) == {
        "variant": 0, "blocks_per_sm": 1, "wpi1": 2, "wpi2": 2}           # 1 block per SM: 528 warps, 768 x 2 >= 1056
    for bad in ({"variant": 6}, {"wpi1": 3}, {"blocks_per_sm": -1}, {"stages": 4}):
        with pytest.raises(ValueError):
            plan(1, 6, 256, 4096, 2048, 132, bad)
    assert op.dispatch.stream_wpi(10, 1, 1000) == 1                   # K of one step: one warp


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


# ----------------------------------------------------------------------------- GPU only
GPU_CASES = [
    # M, I, topk, E, drop, skew, swiglu
    (1, 2048, 6, 32, 0.0, False, 10.0),
    (7, 1024, 8, 32, 0.1, True, None),
    (32, 3072, 6, 16, 0.0, False, 10.0),
    (300, 2048, 6, 32, 0.05, True, 10.0),   # mid tiles, large route path
    (2048, 1024, 8, 64, 0.0, False, None),  # prefill tiles
]


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["dequant", "dot_scaled", "mxfp8", "cuda_decode", "cuda_stream"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"M{c[0]}I{c[1]}k{c[2]}E{c[3]}")
def test_real_shapes(impl, case):
    M, I, k, E, drop, skew, lim = case
    H = 4096
    w = _gpu_weights(E, H, I)
    tw, ids = make_routing(M, E, k, "cuda", seed=M, drop=drop, skew=skew)
    x = torch.randn(M, H, device="cuda").bfloat16()
    # swiglu_limit 10 with |g| up to ~40 here: the clamp is exercised
    x *= 4.0 if lim else 1.0
    if impl in ("cuda_decode", "cuda_stream"):
        _need_cuda_decode()
    limit = {"cuda_decode": op.DECODE_MAX_SLOTS, "cuda_stream": op.STREAM_MAX_SLOTS}.get(impl)
    if limit is not None and M * k > limit:
        with pytest.raises(UnsupportedCase, match=rf"impl '{impl}': M \* topk = {M * k} slots > {limit}"):
            op.fp4_moe(x, *w, tw, ids, impl=impl)
        return
    run_and_check(x, w, tw, ids, impl=impl, swiglu_limit=lim, rsf=1.5)
    c1, c2, used = op.LAST_KERNELS["config"]
    assert used == impl
    if impl in ("cuda_decode", "cuda_stream"):   # their resources are checked at compile time (test_extension_build.py)
        return
    if M == 1 and torch.cuda.get_device_properties(0).multi_processor_count >= 64:
        assert op.LAST_KERNELS["split_k"][0] > 1, "1 token: gemm1 should run split-K"
    for name in ("gemm1", "gemm2"):
        kern = op.LAST_KERNELS[name]
        shared = kern.metadata.shared
        assert shared <= op.SMEM_LIMIT, f"{impl} {name} {c1 if name == 'gemm1' else c2}: smem {shared} B"


_W_CACHE = {}


def _default_impl_spec(x, w, M, k, E, H, I):
    """What fp4_moe(impl=None) must run, stated here rather than read from the op's rule functions (docs/fp4_moe.md,
    dispatch rules): the streaming decode kernels up to 1536 slots and 1024 experts where they apply (CUDA, hidden
    and I multiples of 128, 16-byte aligned rows, the extension loads), then the two-launch decode kernels up to 192
    slots; else by expected rows per expert (<= 8 decode, <= 48 mid, else
    prefill): dequant / dot_scaled / dot_scaled below cc 10, dequant / mxfp8 / mxfp8 from cc 10; the decode regime's
    dequant becomes dot_scaled under a Triton newer than 3.6."""
    from deepseek_v4_kernel._ext import has_fp4_moe_decode, has_fp4_moe_stream
    slots = M * k
    aligned = (x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0
               and all(t.stride(1) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (w[0], w[2])))
    compiled = H % 128 == 0 and I % 128 == 0 and aligned and os.environ.get("DSV4_FP4_MOE_IMPL") is None
    if compiled and 0 < slots <= 1536 and E <= 1024 and has_fp4_moe_stream():
        return "cuda_stream"
    if compiled and slots <= 192 and has_fp4_moe_decode():
        return "cuda_decode"
    per_expert = slots / max(1, min(E, slots))
    regime = "decode" if per_expert <= 8 else "mid" if per_expert <= 48 else "prefill"
    if torch.cuda.get_device_capability(x.device)[0] >= 10:
        impl = {"decode": "dequant", "mid": "mxfp8", "prefill": "mxfp8"}[regime]
    else:
        impl = {"decode": "dequant", "mid": "dot_scaled", "prefill": "dot_scaled"}[regime]
    import triton
    if impl == "dequant" and tuple(int(v) for v in triton.__version__.split(".")[:2]) > (3, 6):
        impl = "dot_scaled"
    return impl


def _need_cuda_decode():
    from deepseek_v4_kernel._ext import has_fp4_moe_decode, has_fp4_moe_stream
    if not (has_fp4_moe_decode() and has_fp4_moe_stream()):
        pytest.skip("the CUDA extension (_C.so with the fp4_moe kernels) is not built: scripts/build_ext.sh")


def _gpu_weights(E, H, I):
    key = (E, H, I)
    if key not in _W_CACHE:
        _W_CACHE.clear()
        _W_CACHE[key] = make_weights(E, H, I, "cuda", torch.float32)  # SGLang keeps float32 scales
    return _W_CACHE[key]


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["dequant", "dot_scaled"])
def test_uint8_scales_same_as_float32(impl):
    E, H, I, M = 8, 4096, 1024, 5
    w13, s13, w2, s2 = make_weights(E, H, I, "cuda", torch.uint8, seed=5)
    f13 = torch.exp2(s13.float() - 127)
    f2 = torch.exp2(s2.float() - 127)
    tw, ids = make_routing(M, E, 4, "cuda")
    x = torch.randn(M, H, device="cuda").bfloat16()
    a = op.fp4_moe(x, w13, s13, w2, s2, tw, ids, impl=impl)
    b = op.fp4_moe(x, w13.view(torch.int8), f13, w2.view(torch.int8), f2, tw, ids, impl=impl)
    assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, {"gemm1": {"SPLIT_K": 3}, "gemm2": {"SPLIT_K": 2}},
                                    {"gemm1": {"SPLIT_K": 1}, "gemm2": {"SPLIT_K": 1}}, "dequant", "cuda_decode"],
                         ids=["default", "split", "nosplit", "dequant", "cuda_decode"])
def test_cuda_graph_capture_replay(config):
    """default: the streaming decode kernels (M * topk = 48 slots); cuda_decode: the two-launch ones; the others:
    Triton."""
    E, H, I, M, k = 16, 4096, 1024, 8, 6
    w = _gpu_weights(E, H, I)
    x = torch.randn(M, H, device="cuda").bfloat16()
    tw, ids = make_routing(M, E, k, "cuda", seed=1)
    out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")
    impl = config if isinstance(config, str) else None
    config = None if isinstance(config, str) else config
    kw = dict(swiglu_limit=10.0, routed_scaling_factor=1.5, out=out, config=config, impl=impl)
    op.fp4_moe(x, *w, tw, ids, **kw)  # compile
    torch.cuda.synchronize()
    triton_default = op.default_impl(op.regime(M, k, E), x.device)   # "dot_scaled" under Triton > 3.6 
    want = impl or (triton_default if config else
                    "cuda_stream" if op.dispatch._cuda_stream_unsupported(x, w[0], w[2], M * k, H, I) is None else
                    "cuda_decode" if op.dispatch._cuda_decode_unsupported(x, w[0], w[2], M * k, H, I) is None else
                    triton_default)
    assert op.LAST_KERNELS["config"][2] == want
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            op.fp4_moe(x, *w, tw, ids, **kw)
    torch.cuda.current_stream().wait_stream(s)
    assert op.LAST_KERNELS["config"][2] == want, "the captured call took another impl than the eager one"
    for seed in (2, 3):  # new routing and activations in the same buffers
        tw2, ids2 = make_routing(M, E, k, "cuda", seed=seed, drop=0.2, skew=seed == 3)
        ids.copy_(ids2), tw.copy_(tw2), x.copy_(torch.randn(M, H, device="cuda").bfloat16())
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = fp4_moe_reference(x, *w, tw, ids, swiglu_limit=10.0, routed_scaling_factor=1.5)
        A = bound(x, *w, tw, ids, 10.0, 1.5)
        assert not torch.isnan(out).any()
        assert ((out.double() - ref).abs() <= 2.0 ** -7 * A + 1e-30).all()


@pytest.mark.gpu
@pytest.mark.parametrize("case", [
    # M, topk, E, ids dtype, weights dtype, drop, skew: duplicate experts in passes of 8 slots,
    # int64 ids, bf16 / fp16 routing weights, dropped slots and fully dropped tokens
    (64, 4, 4, torch.int64, torch.bfloat16, 0.1, False),    # ~58 valid slots per expert: 8 passes
    (5, 6, 32, torch.int32, torch.float16, 0.3, True),
    (3, 6, 8, torch.int32, torch.float32, 1.0, False),      # every slot dropped: out = 0
    (42, 6, 64, torch.int32, torch.float32, 0.0, False),    # 252 slots, near DECODE_MAX_SLOTS
])
@pytest.mark.parametrize("impl", ["cuda_decode", "cuda_stream"])
def test_cuda_decode_routing(case, impl):
    _need_cuda_decode()
    M, k, E, id_dtype, w_dtype, drop, skew = case
    H, I = 4096, 1024
    w = _gpu_weights(E, H, I)
    tw, ids = make_routing(M, E, k, "cuda", seed=M + E, drop=drop, skew=skew)
    if M * k <= E:   # distinct experts across the batch would not test duplicates
        ids = torch.where(ids >= 0, ids % (E // 2), ids)
    x = torch.randn(M, H, device="cuda").bfloat16()
    res = run_and_check(x, w, tw.to(w_dtype), ids.to(id_dtype), impl=impl, swiglu_limit=10.0, rsf=2.5)
    if drop == 1.0:
        assert (res == 0).all()
    again = op.fp4_moe(x, *w, tw.to(w_dtype), ids.to(id_dtype), swiglu_limit=10.0, routed_scaling_factor=2.5,
                       impl=impl)
    assert torch.equal(res, again), "not deterministic (or gemm2's tile counters were not zeroed by gemm1)"


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["cuda_decode", "cuda_stream"])
@pytest.mark.parametrize("lo,hi", [(118, 126), (124, 136)], ids=["scales<=2", "scales>2"])
def test_cuda_decode_scale_range_and_layouts(lo, hi, impl):
    """UE8M0 exponents above 128 (scale > 2) take the kernel's second multiply; uint8 and float32
    scales give bit-identical results; non-contiguous x / out rows (row stride > hidden)."""
    E, H, I, M, k = 8, 4096, 1024, 3, 4
    g = torch.Generator(device="cuda").manual_seed(lo)
    _need_cuda_decode()
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), device="cuda", generator=g, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (E, H, I // 2), device="cuda", generator=g, dtype=torch.uint8)
    s13 = torch.randint(lo, hi, (E, 2 * I, H // 32), device="cuda", generator=g, dtype=torch.uint8)
    s2 = torch.randint(lo, hi, (E, H, I // 32), device="cuda", generator=g, dtype=torch.uint8)
    tw, ids = make_routing(M, E, k, "cuda", seed=lo)
    xs = torch.randn(M, H + 64, device="cuda").bfloat16() * (2.0 ** (120 - hi))
    x = xs[:, 8:H + 8]   # 16-byte aligned rows, stride H + 64
    res = run_and_check(x, (w13, s13, w2, s2), tw, ids, impl=impl, rsf=None)
    f13, f2 = torch.exp2(s13.float() - 127), torch.exp2(s2.float() - 127)
    out = torch.full((M, H + 32), float("nan"), dtype=torch.bfloat16, device="cuda")[:, :H]
    b = op.fp4_moe(x, w13.view(torch.int8), f13, w2.view(torch.int8), f2, tw, ids, impl=impl, out=out)
    assert torch.equal(res, b)


_RAND_W = {}


def _rand_weights(E, H, I, seed=0):
    """Random packed e2m1 bytes and UE8M0 scales 2^-9..2^-3 (as the bench's; every code appears, fast at E = 256),
    float32 scales as SGLang keeps them; one set cached."""
    key = (E, H, I, seed)
    if key not in _RAND_W:
        _RAND_W.clear()
        g = torch.Generator(device="cuda").manual_seed(seed)
        w13 = torch.randint(0, 256, (E, 2 * I, H // 2), device="cuda", generator=g, dtype=torch.uint8)
        w2 = torch.randint(0, 256, (E, H, I // 2), device="cuda", generator=g, dtype=torch.uint8)
        s13 = torch.randint(118, 125, (E, 2 * I, H // 32), device="cuda", generator=g, dtype=torch.uint8)
        s2 = torch.randint(118, 125, (E, H, I // 32), device="cuda", generator=g, dtype=torch.uint8)
        _RAND_W[key] = (w13, s13, w2, s2)
    return _RAND_W[key]


STREAM_CASES = [
    # M, I, topk, E, drop, skew, swiglu, rsf, float32 scales: every size class (1 token: 4 warps per item;
    # 8+: 1), odd M, the TP shards of I = 2048 (1024 / 512 / 256: gemm2 K of 2 steps clamps warps per item),
    # dropped slots, skew (several passes of 8 slots per expert), 1536 and 2048 slots (the limits)
    (1, 2048, 6, 256, 0.0, False, 10.0, 2.5, True),
    (2, 1024, 6, 256, 0.0, False, None, None, False),
    (3, 512, 6, 64, 0.2, False, 10.0, 1.5, False),
    (8, 256, 6, 256, 0.0, False, 10.0, 2.5, True),
    (33, 2048, 6, 64, 0.1, True, 10.0, 2.5, False),
    (256, 1024, 6, 256, 0.0, False, 10.0, 2.5, True),
    (256, 256, 8, 32, 0.05, True, None, 1.5, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("case", STREAM_CASES, ids=lambda c: f"M{c[0]}I{c[1]}k{c[2]}E{c[3]}")
def test_cuda_stream(case, variant):
    """Both built variants of the streaming kernels against the float64 reference; bit-identical on a second run."""
    _need_cuda_decode()
    M, I, k, E, drop, skew, lim, rsf, f32 = case
    H = 4096
    w13, s13, w2, s2 = _rand_weights(E, H, I)
    if f32:
        s13, s2 = torch.exp2(s13.float() - 127), torch.exp2(s2.float() - 127)
    tw, ids = make_routing(M, E, k, "cuda", seed=M + I, drop=drop, skew=skew)
    x = torch.randn(M, H, device="cuda").bfloat16() * (0.5 if lim else 0.1)
    cfg = {"stream": {"variant": variant}}
    res = run_and_check(x, (w13, s13, w2, s2), tw, ids, impl="cuda_stream", swiglu_limit=lim, rsf=rsf,
                        use_out=M % 2 == 1, config=cfg)
    assert op.LAST_KERNELS["stream"]["variant"] == variant
    again = op.fp4_moe(x, w13, s13, w2, s2, tw, ids, swiglu_limit=lim, routed_scaling_factor=rsf,
                       impl="cuda_stream", config=cfg)
    assert torch.equal(res, again), "not deterministic (or the (token, tile) counters were not zeroed by gemm1)"


@pytest.mark.gpu
@pytest.mark.parametrize("wpi1,wpi2,bps", [(1, 1, 0), (2, 4, 1), (4, 2, 2), (4, 4, 0)])
@pytest.mark.parametrize("M", [1, 40])
def test_cuda_stream_groups_and_grid(M, wpi1, wpi2, bps):
    """Every warps-per-item choice and a grid capped to 1-2 blocks per SM (each group then takes many items) give
    the reference's result, and the same bits whatever the grid (only the K split among a group's warps changes the
    fp32 sums: wpi fixed, bps varied)."""
    _need_cuda_decode()
    E, H, I, k = 64, 4096, 1024, 6
    w = _rand_weights(E, H, I)
    tw, ids = make_routing(M, E, k, "cuda", seed=M)
    x = torch.randn(M, H, device="cuda").bfloat16() * 0.5
    cfg = {"stream": {"wpi1": wpi1, "wpi2": wpi2, "blocks_per_sm": bps}}
    res = run_and_check(x, w, tw, ids, impl="cuda_stream", swiglu_limit=10.0, rsf=2.5, config=cfg)
    assert op.LAST_KERNELS["stream"]["wpi1"] == wpi1 and op.LAST_KERNELS["stream"]["wpi2"] == wpi2
    other = op.fp4_moe(x, *w, tw, ids, swiglu_limit=10.0, routed_scaling_factor=2.5, impl="cuda_stream",
                       config={"stream": {"wpi1": wpi1, "wpi2": wpi2, "blocks_per_sm": 1 if bps != 1 else 0}})
    assert torch.equal(res, other), "the grid size changed the result"


@pytest.mark.gpu
@pytest.mark.parametrize("M", [9, 40, 255])
def test_cuda_stream_all_tokens_on_one_expert(M):
    """Every token routes to expert 3 (plus others): that expert has M slots = ceil(M / 8) passes spread over the
    grid's groups; odd M; a few slots of it dropped (-1) and out-of-range ids."""
    _need_cuda_decode()
    E, H, I, k = 32, 4096, 1024, 4
    w = _rand_weights(E, H, I)
    tw, ids = make_routing(M, E, k, "cuda", seed=M)
    ids[:, 0] = 3
    ids[:, 1:] = torch.where(ids[:, 1:] == 3, (ids[:, 1:] + 1) % E, ids[:, 1:])
    ids[1, 0] = -1
    ids[2, 2] = E + 7
    x = torch.randn(M, H, device="cuda").bfloat16() * 0.5
    run_and_check(x, w, tw, ids, impl="cuda_stream", swiglu_limit=10.0, rsf=1.5)


@pytest.mark.gpu
def test_cuda_stream_refuses_by_name():
    _need_cuda_decode()
    w = _rand_weights(8, 256, 128)
    x = torch.randn(4, 256, device="cuda").bfloat16()
    tw, ids = make_routing(4, 8, 2, "cuda")
    with pytest.raises(UnsupportedCase,
                       match=r"impl 'cuda_stream': stream variant must be one of \[0, 1, 2, 3, 4, 5\], got 7"):
        op.fp4_moe(x, *w, tw, ids, impl="cuda_stream", config={"stream": {"variant": 7}})
    with pytest.raises(UnsupportedCase, match=r"impl 'cuda_stream': stream wpi2 must be 1, 2 or 4, got 3"):
        op.fp4_moe(x, *w, tw, ids, impl="cuda_stream", config={"stream": {"wpi2": 3}})
    with pytest.raises(UnsupportedCase, match=r"impl 'cuda_stream': config must be"):
        op.fp4_moe(x, *w, tw, ids, impl="cuda_stream", config={"gemm1": {"BN": 16}})
    big = torch.zeros(1025, 2 * 128, 128, dtype=torch.uint8, device="cuda")   # E = 1025 experts
    bs = torch.full((1025, 256, 8), 127, dtype=torch.uint8, device="cuda")
    w2 = torch.zeros(1025, 256, 64, dtype=torch.uint8, device="cuda")
    s2 = torch.full((1025, 256, 4), 127, dtype=torch.uint8, device="cuda")
    with pytest.raises(UnsupportedCase, match=r"impl 'cuda_stream': E = 1025 experts > 1024"):
        op.fp4_moe(x, big, bs, w2, s2, tw, ids, impl="cuda_stream")
    x = torch.randn(257, 256, device="cuda").bfloat16()
    tw, ids = make_routing(257, 8, 8, "cuda")
    with pytest.raises(UnsupportedCase, match=r"impl 'cuda_stream': M \* topk = 2056 slots > 2048"):
        op.fp4_moe(x, *w, tw, ids, impl="cuda_stream")


@pytest.mark.gpu
def test_default_impl_by_capability():
    if os.environ.get("DSV4_FP4_MOE_IMPL"):
        pytest.skip("DSV4_FP4_MOE_IMPL set")
    major = torch.cuda.get_device_capability()[0]
    want = dict(op.DEFAULT_IMPL_CC10 if major >= 10 else op.DEFAULT_IMPL_SM90)
    if op.dispatch.triton_version() > op.DEQUANT_DECODE_MAX_TRITON:
        want = {k: "dot_scaled" if v == "dequant" else v for k, v in want.items()}
    for name in ("decode", "mid", "prefill"):
        assert op.default_impl(name) == want[name]
    assert op.regime(1, 6, 256) == "decode" and op.regime(8192, 6, 256) == "prefill"


@pytest.mark.parametrize("cc, version, decode", [((12, 0), (3, 6), "dequant"), ((12, 0), (3, 8), "dot_scaled"),
                                                 ((9, 0), (3, 6), "dequant"), ((9, 0), (3, 8), "dot_scaled"),
                                                 ((12, 0), (3, 5), "dequant"), ((12, 0), (4, 1), "dot_scaled")])
def test_default_impl_decode_regime_by_triton_version(monkeypatch, cc, version, decode):
    """H100: triton 3.8.0 builds "dequant" through shared memory and it lost 1.4x to "dot_scaled" at 64-256
    tokens; so the decode regime takes "dequant" only up to DEQUANT_DECODE_MAX_TRITON, and the other regimes keep
    their table's impl under every version."""
    monkeypatch.delenv("DSV4_FP4_MOE_IMPL", raising=False)
    monkeypatch.setattr(op.dispatch, "_interp", lambda: False)
    monkeypatch.setattr(op.dispatch.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(op.dispatch.torch.cuda, "get_device_capability", lambda device=None: cc)
    monkeypatch.setattr(op.dispatch, "triton_version", lambda: version)
    table = op.DEFAULT_IMPL_CC10 if cc[0] >= 10 else op.DEFAULT_IMPL_SM90
    assert op.default_impl("decode", "cuda") == decode
    assert op.default_impl("mid", "cuda") == table["mid"] and op.default_impl("prefill", "cuda") == table["prefill"]


# ----------------------------------------------------------------------------- sm_120 AOT (CPU)
@pytest.fixture(scope="module")
def sm120_aot():
    """Compile the picked tiles at DeepSeek-V4 shapes for sm_120a in a subprocess (the test
    process runs Triton in interpreter mode): mxfp8 (the cc >= 10 default at mid and prefill) at
    every regime, the exact impls at decode (dequant is the cc >= 10 default there; "decode1" = 1
    token, the split-K variants) and prefill (their largest tiles)."""
    import json
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    script = os.path.join(root, "tools", "aot_fp4_moe.py")
    recs = []
    for impls, labels in (("mxfp8", "decode,mid,prefill"), ("dequant,dot_scaled", "decode1,decode,prefill")):
        r = subprocess.run([sys.executable, script, "--arch", "120", "--impls", impls,
                            "--labels", labels], env=env, capture_output=True, text=True,
                           timeout=600, cwd=root)
        if r.returncode != 0:
            skip_or_fail(r.stderr, "sm_120 AOT compile")
        recs += [json.loads(ln[3:]) for ln in r.stdout.splitlines() if ln.startswith("AOT")]
    return recs


def test_sm120_aot_smem_and_instructions(sm120_aot):
    """<= 101376 B shared memory, mma.sync only (no wgmma/tcgen05, absent on SM120), and the
    mxfp8 impl lowers to the native block-scaled MMA (kind::mxf8f6f4)."""
    assert len(sm120_aot) == 18
    assert all(d["config"]["SPLIT_K"] > 1 for d in sm120_aot if d["label"] == "decode1")
    for d in sm120_aot:
        assert "error" not in d, d
        assert d["shared"] <= op.SMEM_LIMIT, d
        assert d["mma_sync"] and not d["wgmma"] and not d["tcgen05"], d
        if d["impl"] == "mxfp8":
            assert d["mxf8f6f4"] and d["block_scale"], d
        else:
            assert not d["block_scale"], d


# ----------------------------------------------------------------------------- GPU fuzz
# Random calls beyond the hand-picked cases: tokens, hidden / I sizes (multiples of 32, some not of 128, which
# the compiled decode kernels refuse by name), experts, top-k, dropped and out-of-range ids, skewed routing,
# ids / weights dtypes, swiglu clamp, scaling factor, a caller's out, strided x, each impl, and the grid sized
# for 188 / 170 / 24 SMs or this GPU's (op.api.sm_count); decode sizes also replayed from a CUDA graph. Seeds (8 per
# run by default) and failure naming: tests/fuzz.py.
@pytest.mark.gpu
@pytest.mark.parametrize("seed", SEEDS)
def test_gpu_fuzz(monkeypatch, seed):
    import random
    r = random.Random(seed)
    H = r.choice([4096, 4096, 128 * r.randint(1, 16), 32 * r.randint(1, 64)])
    I = r.choice([1024, 2048, 128 * r.randint(1, 16), 32 * r.randint(1, 64)])
    E = r.choice([4, 8, 16, 32, 64, 256])
    while E > 1 and E * H * I * 3 > 2 ** 28:   # bounded weight generation
        E //= 2
    k = r.randint(1, min(8, E))
    M = r.choice([r.randint(1, 48), int(2 ** r.uniform(0, 10))])
    impl = r.choice([None, None, "dequant", "dot_scaled", "mxfp8", "cuda_decode", "cuda_stream"])
    drop = r.choice([0.0, 0.0, 0.1, 1.0])
    skew = r.random() < 0.3
    lim = r.choice([None, 10.0])
    rsf = r.choice([None, 1.5, 2.5])
    sms = r.choice(SM_COUNTS)
    desc = (f"seed {seed}: M={M} H={H} I={I} E={E} k={k} impl={impl} drop={drop} skew={skew} lim={lim} "
            f"rsf={rsf} sms={sms}")
    print(desc)
    patch_sm_count(monkeypatch, op.api, "sm_count", sms)
    w = _gpu_weights(E, H, I)
    tw, ids = make_routing(M, E, k, "cuda", seed=seed, drop=drop, skew=skew)
    if r.random() < 0.2:   # ids past the experts: dropped like -1
        ids = torch.where(torch.rand(ids.shape, device="cuda") < 0.1, torch.full_like(ids, E + 3), ids)
    ids = ids.to(r.choice([torch.int32, torch.int64]))
    tw = tw.to(r.choice([torch.float32, torch.bfloat16, torch.float16]))
    x = torch.randn(M, H, device="cuda").bfloat16() * (4.0 if lim else 1.0)
    if r.random() < 0.2:
        x = torch.cat([x, torch.zeros(M, 64, device="cuda", dtype=torch.bfloat16)], 1)[:, :H]
    expect = None
    if impl is None:   # the default dispatch, as SGLang calls it: the test's own statement of the rule
        expect = _default_impl_spec(x, w, M, k, E, H, I)
        if expect == "cuda_decode":
            _need_cuda_decode()
        with named(f"{desc} -> default (expected {expect})"):
            res = run_and_check(x, w, tw, ids, swiglu_limit=lim, rsf=rsf, use_out=r.random() < 0.5,
                                expect_impl=expect)
        impl = expect
    elif impl in ("cuda_decode", "cuda_stream"):
        _need_cuda_decode()
        why = (op.dispatch._cuda_decode_unsupported if impl == "cuda_decode" else
               op.dispatch._cuda_stream_unsupported)(x, w[0], w[2], M * k, H, I)
        if why is not None:
            with pytest.raises(UnsupportedCase, match=f"impl '{impl}'"):
                op.fp4_moe(x, *w, tw, ids, impl=impl)
            return
    if expect is None:
        use_out = r.random() < 0.5
        with named(f"{desc} -> impl {impl}"):
            res = run_and_check(x, w, tw, ids, impl=impl, swiglu_limit=lim, rsf=rsf, use_out=use_out)
    if seed % 3 == 0 and M * k <= op.DECODE_MAX_SLOTS:   # decode sizes also replayed from a CUDA graph
        got = replay_on_poisoned(lambda: op.fp4_moe(x, *w, tw, ids, swiglu_limit=lim, routed_scaling_factor=rsf,
                                                    impl=impl), lambda out: (out,))
        assert torch.equal(got, res), f"graph replay differs from eager: {desc}"
