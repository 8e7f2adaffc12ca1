"""fp8_linear / fp8_grouped_linear (block-scaled FP8 linear at decode sizes) vs the float64 reference.

Tolerance (bf16 out): the weights are used exactly (e4m3 -> f16 is exact), x is converted to f16 with a power-of-two
scale per (token, 128-K group), exact for every value within 2^28 of its group's max (tests/host/fp8_linear_check.cu
covers the rest); the f16 products are exact in fp32; what rounds is the fp32 accumulation (mma.sync over 128 K, then
one scaled add per 128-K step and the split-K sums: a few hundred fp32 adds at most, each <= 2^-24 of A) and the
final bf16 rounding (<= 2^-9 |ref|). With A = |x| @ |W_real|^T (float64), per element
    |out - ref| <= 2^-8 |ref| + 2^-14 A.
A wrong K step, row, token or scale is off by O(A) and fails it.
"""

import pytest
import torch

from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.ops.fp8_linear import dispatch as disp
from deepseek_v4_kernel.ops.fp8_linear import fp8_grouped_linear, fp8_linear, fp8_linear_supported
from deepseek_v4_kernel.ops.fp8_linear.shapes import TP_SIZES, model_shapes
from deepseek_v4_kernel.reference.fp8_linear import (abs_bound, dequantize, fp8_grouped_linear_reference,
                                                     fp8_linear_reference, pack_ue8m0_deepgemm, quantize_block_fp8,
                                                     row_scales_f64, unpack_ue8m0_deepgemm)

from fuzz import SEEDS, SM_COUNTS, named, patch_sm_count, replay_on_poisoned

HAS_CUDA = torch.cuda.is_available()
HAS_E8M0 = hasattr(torch, "float8_e8m0fnu")
SCALE_FORMS = ("f32", "ue8m0", "e8m0fnu", "packed")
gpu = pytest.mark.gpu


@pytest.fixture(autouse=True)
def fp8_kernel(request, monkeypatch):
    """The kernel a GPU test runs (DSV4_FP8_LINEAR_KERNEL): every GPU test runs once per kernel (ring, regs)."""
    k = getattr(request, "param", None)
    if k is not None:
        monkeypatch.setenv(disp.KERNEL_ENV, k)
    yield k


def pytest_generate_tests(metafunc):
    if "fp8_kernel" in metafunc.fixturenames and metafunc.definition.get_closest_marker("gpu") is not None:
        metafunc.parametrize("fp8_kernel", disp.KERNELS, indirect=True)


# ----------------------------------------------------------------------------- helpers
def make_weight(N, K, form, device, groups=None, seed=0):
    """Real weights (per-block magnitudes spread over several binades) -> e4m3 + scales in the given form."""
    g = torch.Generator(device=device).manual_seed(seed)
    lead = () if groups is None else (groups,)
    w = torch.randn(*lead, N, K, generator=g, device=device) * 0.02
    nb, kb = -(-N // 128), K // 128
    mag = torch.exp2(torch.randint(-3, 4, (*lead, nb, kb), generator=g, device=device).float())
    w = w * mag.repeat_interleave(128, -2)[..., :N, :].repeat_interleave(128, -1)
    q, s = quantize_block_fp8(w, ue8m0=form != "f32")
    if form == "e8m0fnu":
        if not HAS_E8M0:
            pytest.skip("torch has no float8_e8m0fnu")
        s = s.view(torch.float8_e8m0fnu)
    elif form == "packed":
        s = pack_ue8m0_deepgemm(s, N)
    return q, s


def make_x(M, K, device, seed=0, groups=None, row_stride=None):
    g = torch.Generator(device="cpu").manual_seed(seed + 1000)
    shape = (M, K) if groups is None else (M, groups, K)
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-4, 5, shape[:-1] + (1,), generator=g).float())
    x[..., : K // 8][torch.rand(shape[:-1] + (K // 8,), generator=g) < 0.1] = 0.0   # some exact zeros
    x = x.bfloat16()
    if row_stride is not None:
        assert groups is None
        big = torch.full((M, row_stride), float("nan"), dtype=torch.bfloat16)
        big[:, :K] = x
        return big.to(device)[:, :K]
    return x.to(device)


def check(out, ref, A, desc=""):
    out = out.to(torch.float64)
    assert torch.isfinite(out).all(), f"{desc}: non-finite outputs"
    err = (out - ref).abs()
    bound = 2.0 ** -8 * ref.abs() + 2.0 ** -14 * A
    bad = err > bound
    assert not bad.any(), (f"{desc}: {int(bad.sum())} / {bad.numel()} outside the bound; worst err "
                           f"{float(err.max()):.3e}, at it bound {float(bound.flatten()[err.argmax()]):.3e}")


def run_linear(M, N, K, form, *, seed=0, bias=False, out=False, splits=None, decode=None, row_stride=None,
               device="cuda"):
    w, s = make_weight(N, K, form, device, seed=seed)
    x = make_x(M, K, device, seed=seed, row_stride=row_stride)
    b = (torch.randn(N, generator=torch.Generator().manual_seed(seed + 7)) * 0.5).bfloat16().to(device) if bias else None
    o = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=device) if out else None
    y = fp8_linear(x, w, s, bias=b, out=o, splits=splits, decode=decode)
    if out:
        assert y.data_ptr() == o.data_ptr()
    ref = fp8_linear_reference(x, w, s, bias=b)
    A = abs_bound(x, w, s) + (b.double().abs() if bias else 0)
    return y, ref, A


# ----------------------------------------------------------------------------- CPU: reference, packers, rules
def test_scale_forms_dequantize_alike():
    """fp32 powers of two, UE8M0 bytes, e8m0fnu and DeepGEMM's packed int32 give the same real weights."""
    N, K = 300, 640
    w, s_u8 = make_weight(N, K, "ue8m0", "cpu")
    s_f32 = torch.exp2(s_u8.float() - 127)
    ref = dequantize(w, s_f32)
    assert torch.equal(dequantize(w, s_u8), ref)
    packed = pack_ue8m0_deepgemm(s_u8, N)
    assert torch.equal(dequantize(w, packed), ref)
    if HAS_E8M0:
        assert torch.equal(dequantize(w, s_u8.view(torch.float8_e8m0fnu)), ref)
    assert torch.equal(row_scales_f64(packed, N, K), row_scales_f64(s_u8, N, K))


def test_pack_ue8m0_deepgemm_layout():
    """int32 [N, ceil(Kb/4)], row stride 1, word stride N rounded up to 4; K block 4w + j in byte j of word w."""
    N, kb = 130, 6
    s = torch.randint(100, 150, (2, -(-N // 128), kb), dtype=torch.uint8)
    p = pack_ue8m0_deepgemm(s, N)
    assert p.dtype == torch.int32 and tuple(p.shape) == (2, N, 2) and p.stride()[1:] == (1, 132)
    for g, n, k in ((0, 0, 0), (1, 129, 5), (0, 127, 3), (1, 128, 4)):
        word = int(p[g, n, k // 4]) & 0xFFFFFFFF
        assert (word >> (8 * (k % 4))) & 0xFF == int(s[g, n // 128, k]), (g, n, k)
    assert int(p[0, 5, 1]) >> 16 == 0   # K blocks 6, 7 (past Kb) are zero bytes
    assert torch.equal(unpack_ue8m0_deepgemm(p, kb * 128), s.repeat_interleave(128, 1)[:, :N])


def test_quantize_block_fp8_roundtrip():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(256, 384, generator=g)
    for ue8m0 in (False, True):
        q, s = quantize_block_fp8(w, ue8m0=ue8m0)
        back = dequantize(q, s)
        rel = ((back - w.double()).abs() / w.double().abs().amax()).max()
        assert rel < 2 ** -3, (ue8m0, float(rel))
        assert q.dtype == torch.float8_e4m3fn and s.shape == (2, 3)
        assert (q.float().abs() <= 448).all()


def test_fp8_linear_reference_small_exact():
    """The reference against a hand-computed product (one 128 x 128 block, scale 2, bias)."""
    w = torch.zeros(2, 128)
    w[0, 0], w[1, 127] = 1.5, -3.0
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    x[0, 0], x[0, 127] = 2.0, 0.25
    q, s = w.to(torch.float8_e4m3fn), torch.full((1, 1), 2.0)
    y = fp8_linear_reference(x, q, s, bias=torch.tensor([1.0, 0.0]).bfloat16())
    assert y.tolist() == [[1.0 + 2 * 1.5 * 2.0, 2 * -3.0 * 0.25]]


@pytest.mark.parametrize("tp", TP_SIZES)
def test_supported_on_every_model_shape(tp):
    for sh in model_shapes(tp):
        for M in (1, 2, 16, 17, 63, 64):
            for dt in (torch.float32, torch.uint8, torch.int32):
                ok, why = fp8_linear_supported(M, sh.N, sh.K, (128, 128), dt, groups=sh.groups)
                assert ok and why == "", (sh, M, dt, why)


def test_supported_refusals_name_the_argument():
    cases = [
        (dict(M=65, N=1024, K=4096), "M must be in [1, 64]"),
        (dict(M=0, N=1024, K=4096), "M must be in [1, 64]"),
        (dict(M=4, N=1024, K=4000), "K must be a positive multiple of 128, got 4000"),
        (dict(M=4, N=0, K=4096), "N must be >= 1, got 0"),
        (dict(M=4, N=1024, K=4096, block_size=(32, 32)), "block_size must be (128, 128), got (32, 32)"),
        (dict(M=4, N=1024, K=4096, scale_dtype=torch.bfloat16), "weight_scale dtype must be"),
        (dict(M=4, N=1024, K=4096, x_stride=4100), "x rows must be 16-byte aligned"),
    ]
    for kw, msg in cases:
        kw = dict(kw)
        ok, why = fp8_linear_supported(kw.pop("M"), kw.pop("N"), kw.pop("K"), kw.pop("block_size", (128, 128)),
                                       kw.pop("scale_dtype", torch.float32), **kw)
        assert not ok and msg in why and why.startswith("fp8_linear: "), (kw, why)


def test_argument_checks_name_argument_and_expected():
    """On CPU tensors: every malformed argument raises UnsupportedCase naming it (before any device work)."""
    N, K, M = 256, 512, 4
    w, s = make_weight(N, K, "f32", "cpu")
    x = make_x(M, K, "cpu")
    bad = [
        (lambda: fp8_linear(x.float(), w, s), "x must be bf16 [M, K]"),
        (lambda: fp8_linear(x, w.view(torch.uint8), s), "weight must be float8_e4m3fn [N, K]"),
        (lambda: fp8_linear(x[:, :384], w, s), "weight must be [N, K] with K = x.shape[-1] = 384"),
        (lambda: fp8_linear(x, w, s[:, :3]), "weight_scale (torch.float32) must be [ceil(N/128), K/128] = [2, 4]"),
        (lambda: fp8_linear(x, w, s.bfloat16()), "weight_scale dtype must be"),
        (lambda: fp8_linear(x, w, s, block_size=(32, 32)), "block_size must be (128, 128), got (32, 32)"),
        (lambda: fp8_linear(make_x(65, K, "cpu"), w, s), "M must be in [1, 64]"),
        (lambda: fp8_linear(x, w, s, out=torch.empty(M, N)), "out must be bf16 [4, 256]"),
        (lambda: fp8_linear(x, w, s, out=torch.empty(M, N + 1, dtype=torch.bfloat16)), "out must be bf16 [4, 256]"),
        (lambda: fp8_linear(x, w, s, bias=torch.zeros(N)), "bias must be None or bf16 [N] = [256]"),
        (lambda: fp8_linear(x, w, s, bias=torch.zeros(N + 1, dtype=torch.bfloat16)), "bias must be None or bf16 [N]"),
        (lambda: fp8_linear(make_x(M, K, "cpu", row_stride=K + 4), w, s), "x must have unit stride along K and 16-byte"),
        (lambda: fp8_linear(x, w, s, decode="fast"), "decode must be one of ['cvt', 'int']"),
        (lambda: fp8_linear(x, w, s), "needs a CUDA device"),
        (lambda: fp8_grouped_linear(x, w, s), "x must be bf16 [M, G, K]"),
    ]
    wg, sg = make_weight(N, K, "packed", "cpu", groups=2)
    xg = make_x(M, K, "cpu", groups=2)
    bad += [
        (lambda: fp8_grouped_linear(xg, wg[:1], sg), "with K = x.shape[-1] = 512 and G = x.shape[1] = 2"),
        (lambda: fp8_grouped_linear(xg, wg, sg[:, :128]), "must be [G] + int32 [N, ceil(K/512)] (DeepGEMM's packed UE8M0) = [2, 256, 1]"),
        (lambda: fp8_grouped_linear(xg, wg, sg, out=torch.empty(M, 2, N + 1, dtype=torch.bfloat16)),
         "out must be bf16 [4, 2, 256]"),
    ]
    for call, msg in bad:
        with pytest.raises(UnsupportedCase) as e:
            call()
        assert msg in str(e.value) and str(e.value).startswith("fp8_linear: "), (msg, str(e.value))


def test_zero_tokens_return_empty():
    w, s = make_weight(256, 256, "f32", "cpu")
    y = fp8_linear(torch.empty(0, 256, dtype=torch.bfloat16), w, s)
    assert tuple(y.shape) == (0, 256) and y.dtype == torch.bfloat16


def test_pick_splits_rule():
    """Pinned at the docstring's shapes (132 SMs, M = 1), and always within [1, min(K / 128, 64)]."""
    assert disp.pick_splits(1, 1024, 4096, 1, 132, kernel="regs") == 16
    assert disp.pick_splits(1, 32768, 1024, 1, 132, kernel="regs") == 1
    assert disp.pick_splits(1, 4096, 8192, 1, 132, kernel="regs") == 8
    assert disp.pick_splits(1, 1024, 4096, 8, 132, kernel="regs") == 4
    assert disp.pick_splits(1, 1024, 4096, 1, 132) == 16
    assert disp.pick_splits(64, 1024, 4096, 1, 132) == 11
    assert disp.pick_splits(1, 32768, 1024, 1, 132) == 1
    assert disp.pick_splits(1, 4096, 8192, 1, 132) == 4
    assert disp.pick_splits(1, 1024, 4096, 8, 132) == 2
    for tp in TP_SIZES:
        for sh in model_shapes(tp):
            for sms in (24, 132, 170, 188):
                for M in (1, 8, 16, 33, 64):
                    for mode in (0, 1, 2):
                        for kern in disp.KERNELS:
                            s = disp.pick_splits(M, sh.N, sh.K, sh.groups or 1, sms, mode, kern)
                            assert 1 <= s <= min(sh.K // 128, 64), (sh, sms, M, s)


def test_token_tile_mirror_of_the_kernel():
    """dispatch's mirror of fp8_linear.cu's tile counts and kernel.cuh's Cfg (ring, blocks per SM)."""
    import os
    csrc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc", "fp8_linear")
    src = open(os.path.join(csrc, "fp8_linear.cu")).read()
    assert "kTileCounts[6] = {1, 2, 3, 4, 6, 8}" in src and disp.TILE_COUNTS == (1, 2, 3, 4, 6, 8)
    assert [disp.token_tiles(m) for m in (1, 8, 9, 16, 17, 24, 25, 32, 33, 48, 49, 64)] == \
        [1, 1, 2, 2, 3, 3, 4, 4, 6, 6, 8, 8]
    hdr = open(os.path.join(csrc, "kernel.cuh")).read()
    assert "kRing = (MT <= 2 || MT >= 5) ? 3 : 2;" in hdr and "kPiece = MT <= 2 ? 3 : MT <= 4 ? 2 : 1;" in hdr
    assert [disp.ring_steps(t) for t in disp.TILE_COUNTS] == [3, 3, 2, 2, 3, 3]
    assert [disp.piece_steps(t) for t in disp.TILE_COUNTS] == [3, 3, 2, 2, 1, 1]
    assert "kMinBlocks = (MT <= 3 || (MT == 4 && kMode != 2)) ? 2 : 1;" in hdr
    ring = open(os.path.join(csrc, "kernel_ring.cuh")).read()
    assert "kStages = kFit > 5 ? 5 : kFit;" in ring and "kStage = kStageW + kStageX + kStageI + kStageS;" in ring
    assert [disp.ring_stages(t) for t in disp.TILE_COUNTS] == [5, 4, 4, 4, 3, 3]
    assert all(disp.ring_smem_bytes(t) <= 101376 for t in disp.TILE_COUNTS)


def test_kernel_and_splits_switches(monkeypatch):
    """DSV4_FP8_LINEAR_KERNEL / _DECODE / _SPLITS go through the one parser: bad values name the variable."""
    from deepseek_v4_kernel.switches import SWITCHES, InvalidSwitch
    assert SWITCHES[disp.KERNEL_ENV] == disp.KERNELS and SWITCHES[disp.DECODE_ENV] == disp.DECODES
    assert tuple(SWITCHES[disp.SPLITS_ENV]) == (1, disp.MAX_SPLITS)
    assert disp.kernel_choice() == "auto" and disp.decode_choice() == "cvt"
    assert [disp.kernel_choice(None, m) for m in (1, 16, 31, 32, 64)] == ["regs"] * 3 + ["ring"] * 2
    monkeypatch.setenv(disp.KERNEL_ENV, " REGS ")
    assert disp.kernel_choice() == "regs" and disp.kernel_choice("ring") == "ring"
    monkeypatch.setenv(disp.KERNEL_ENV, "fast")
    with pytest.raises(InvalidSwitch, match="DSV4_FP8_LINEAR_KERNEL must be one of auto, ring, regs, got 'fast'"):
        disp.kernel_choice()
    monkeypatch.setenv(disp.SPLITS_ENV, "3")
    assert disp.pick_splits(1, 1024, 4096, 1, 132) == 3
    monkeypatch.setenv(disp.SPLITS_ENV, "200")
    with pytest.raises(InvalidSwitch, match=r"DSV4_FP8_LINEAR_SPLITS must be an integer in \[1, 64\], got '200'"):
        disp.pick_splits(1, 1024, 4096, 1, 132)
    monkeypatch.setenv(disp.SPLITS_ENV, "two")
    with pytest.raises(InvalidSwitch, match="DSV4_FP8_LINEAR_SPLITS must be an integer"):
        disp.pick_splits(1, 1024, 4096, 1, 132)


# ----------------------------------------------------------------------------- GPU
@gpu
@pytest.mark.parametrize("form", SCALE_FORMS)
@pytest.mark.parametrize("M", [1, 3, 8, 17, 63, 64])
def test_matches_reference(M, form):
    y, ref, A = run_linear(M, 300, 640, form, seed=M, out=True)
    check(y, ref, A, f"M={M} form={form}")


@gpu
@pytest.mark.parametrize("decode", ["cvt", "int"])
@pytest.mark.parametrize("splits", [None, 1, 2, 3, 5])
@pytest.mark.parametrize("bias", [False, True])
def test_splits_bias_decode(splits, bias, decode):
    for M in (2, 24, 40):
        y, ref, A = run_linear(M, 260, 640, "f32", seed=M, bias=bias, splits=splits, decode=decode)
        check(y, ref, A, f"M={M} splits={splits} bias={bias} decode={decode}")


@gpu
@pytest.mark.parametrize("N", [1, 16, 100, 129, 383])
def test_odd_n(N):
    for M in (1, 9):
        y, ref, A = run_linear(M, N, 256, "packed", seed=N)
        check(y, ref, A, f"N={N} M={M}")


@gpu
def test_strided_x_rows():
    y, ref, A = run_linear(5, 256, 512, "ue8m0", row_stride=512 + 64)
    check(y, ref, A, "strided x")


@gpu
@pytest.mark.parametrize("tp", TP_SIZES, ids=lambda tp: f"tp{tp}")
def test_every_model_shape(tp):
    for sh in model_shapes(tp):
        for M, form in ((1, "f32"), (5, "packed"), (16, "ue8m0")):
            if sh.groups:
                w, s = make_weight(sh.N, sh.K, form, "cuda", groups=sh.groups, seed=M)
                x = make_x(M, sh.K, "cuda", seed=M, groups=sh.groups)
                y = fp8_grouped_linear(x, w, s)
                check(y, fp8_grouped_linear_reference(x, w, s), abs_bound(x, w, s, grouped=True), f"{sh} M={M}")
            else:
                y, ref, A = run_linear(M, sh.N, sh.K, form, seed=M)
                check(y, ref, A, f"tp={tp} {sh.name} {sh.N}x{sh.K} M={M} {form}")
        torch.cuda.empty_cache()


@gpu
@pytest.mark.parametrize("form", ["f32", "packed"])
@pytest.mark.parametrize("G", [8, 2, 1])
def test_grouped_matches_reference(G, form):
    for M in (1, 7, 33):
        w, s = make_weight(256, 1024, form, "cuda", groups=G, seed=G + M)
        x = make_x(M, 1024, "cuda", seed=M, groups=G)
        o = torch.full((M, G, 256), float("nan"), dtype=torch.bfloat16, device="cuda")
        y = fp8_grouped_linear(x, w, s, out=o)
        assert y.data_ptr() == o.data_ptr()
        check(y, fp8_grouped_linear_reference(x, w, s), abs_bound(x, w, s, grouped=True), f"G={G} M={M} {form}")


@gpu
def test_deterministic_and_graph_replay_on_poisoned():
    """Split-K sums in a fixed order: two eager calls and a graph replay (outputs NaN-poisoned before it) agree
    bit for bit; a second replay after poisoning again as well (the tile counters are back to zero)."""
    w, s = make_weight(1024, 4096, "ue8m0", "cuda")
    x = make_x(6, 4096, "cuda")
    a = fp8_linear(x, w, s, splits=8)
    b = fp8_linear(x, w, s, splits=8)
    assert torch.equal(a, b)
    out = torch.empty_like(a)
    res = replay_on_poisoned(lambda: fp8_linear(x, w, s, out=out, splits=8), lambda r: [r])
    assert torch.equal(res, a)
    wg, sg = make_weight(1024, 4096, "packed", "cuda", groups=8)
    xg = make_x(3, 4096, "cuda", groups=8)
    ref = fp8_grouped_linear(xg, wg, sg)
    res = replay_on_poisoned(lambda: fp8_grouped_linear(xg, wg, sg), lambda r: [r], warm_up=False)
    assert torch.equal(res, ref)


@gpu
def test_nonfinite_x_group_gives_nan():
    """A 128-K group of x holding inf makes its token's outputs NaN (documented), the other tokens stay right."""
    w, s = make_weight(128, 256, "f32", "cuda")
    x = make_x(3, 256, "cuda")
    x[1, 130] = float("inf")
    y = fp8_linear(x, w, s)
    assert torch.isnan(y[1]).all()
    check(y[[0, 2]], fp8_linear_reference(x[[0, 2]], w, s), abs_bound(x[[0, 2]], w, s), "finite rows")


@gpu
@pytest.mark.parametrize("seed", SEEDS)
def test_gpu_fuzz(seed, monkeypatch):
    """Random shapes, scale forms, SM counts (the split choice of an RTX 5090 / PRO 6000 / small GPU), bias, out,
    decode."""
    import random

    from deepseek_v4_kernel.ops.fp8_linear import api
    r = random.Random(seed)
    patch_sm_count(monkeypatch, api, "sm_count", r.choice(SM_COUNTS))
    M = r.choice([1, 2, 3, 7, 8, 9, 16, 17, 31, 33, 47, 48, 64])
    N = r.choice([8, 128, 200, 384, 1000])
    K = 128 * r.choice([1, 2, 3, 5, 8, 16])
    form = r.choice(SCALE_FORMS if HAS_E8M0 else ("f32", "ue8m0", "packed"))
    desc = f"seed={seed} M={M} N={N} K={K} form={form}"
    with named(desc):
        y, ref, A = run_linear(M, N, K, form, seed=seed, bias=r.random() < 0.5, out=r.random() < 0.5,
                               decode=r.choice(["cvt", "int"]))
        check(y, ref, A, desc)


def test_constants_and_ctypes_mirror_match_params_h():
    """MAX_M / TILE_N / MAX_SPLITS are params.h's, and the ctypes mirror lists its fields in order (the loader also
    compares the struct sizes)."""
    import re

    from c_headers import header, struct_fields
    from deepseek_v4_kernel._ext import Fp8LinearParams
    src = header("fp8_linear")
    consts = dict(re.findall(r"#define DSV4_FP8_LINEAR_(\w+) (\d+)", src))
    assert int(consts["MAX_M"]) == disp.MAX_M and int(consts["TILE_N"]) == disp.TILE_N
    assert int(consts["MAX_SPLITS"]) == disp.MAX_SPLITS
    assert struct_fields(src, "Fp8LinearParams") == [f for f, _ in Fp8LinearParams._fields_]


def test_c_abi_refuses_bad_sizes():
    """dsv4_fp8_linear's own size checks (no device needed): splits past K / 128, K not a multiple of 128, M past 64,
    a split without a workspace are refused with the error text naming them."""
    import ctypes

    from deepseek_v4_kernel import _ext
    if not _ext.has_fp8_linear():
        pytest.skip("the CUDA extension with fp8_linear is not built here (scripts/build_ext.sh)")
    lib = _ext.load()
    base = dict(M=1, N=256, K=256, G=1, splits=1, w_stride_n=256, x=16, w=16, scale=16, out=16)
    for bad in (dict(splits=3), dict(K=200, w_stride_n=208), dict(M=65), dict(splits=2), dict(scale_mode=3),
                dict(kernel=1, splits=3), dict(kernel=2, xf=16), dict(kernel=0, xf=None)):
        p = _ext.Fp8LinearParams(**{**base, **bad})
        assert lib.dsv4_fp8_linear(ctypes.byref(p), None) != 0, bad
        assert "fp8_linear: bad sizes" in _ext.last_error(), bad
