"""hc_prenorm (DeepGEMM tf32_hc_prenorm_gemm) vs the float64 reference.

Tolerances (per element, A = |x| @ |fn|^T in float64, the sum of |products|):
* out, tf32 mode: DeepGEMM rounds fn to tf32 (10 explicit mantissa bits, truncation
  on the tensor core = relative error < 2^-10 per product; x is bf16 so exact), plus
  fp32 accumulation -> |err| <= 1.5 * 2^-10 * A.
* out, bf16x2 mode (default): fn = hi + lo in bf16 keeps >= 15 bits (2^-15 per
  product, even with truncating casts), plus fp32 accumulation -> |err| <= 2^-13 * A.
  (Under the CPU interpreter "tf32" runs as fp32, so both bounds hold a fortiori.)
* sqrsum: squares of bf16 are exact in fp32; only fp32 summation error remains, a
  positive sum, so relative: rtol 2e-5 (K = 16384 summed as <= 256 partials of 64).
"""
import os

import pytest
import torch

from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.reference.hc_prenorm import hc_prenorm_abs_scale, hc_prenorm_gemm_ref, split_bounds
from fuzz import SEEDS, SM_COUNTS, named, patch_sm_count, replay_on_poisoned

from deepseek_v4_kernel.ops import hc_prenorm as hp
from deepseek_v4_kernel.patch import adapters as ad   # SGLang's signatures; registers its determinism switch

SPLITS = [None, 1, 2, 4, 8, 16]


def _inputs(m, K, n=24, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, K, generator=g).bfloat16().to(device)
    fn = (torch.randn(n, K, generator=g) * 0.05).to(device)
    return x, fn


def _poisoned(m, n, S, device, flat=False):
    if flat:
        return (torch.full((m, n), float("nan"), device=device),
                torch.full((m,), float("nan"), device=device))
    return (torch.full((S, m, n), float("nan"), device=device),
            torch.full((S, m), float("nan"), device=device))


def _strided_out(S, m, lo, device="cuda", n=24, width=32):
    """Caller-owned strided buffers: out [S, m, n] at column offset lo of a NaN-filled [S, m, width] tensor
    (row stride width), sqrsum [S, m] as the transpose of a NaN-filled [m, S] one (strides (1, S)). Returns
    (out, sqrsum, margins_nan), the last a function: whether nothing was written beside out."""
    big = torch.full((S, m, width), float("nan"), device=device)
    sq = torch.full((m, S), float("nan"), device=device).T
    return big[:, :, lo:lo + n], sq, lambda: bool(torch.isnan(big[:, :, :lo]).all() and torch.isnan(big[:, :, lo + n:]).all())


def _check(x, fn, out, sq, num_splits):
    ro, rs = hc_prenorm_gemm_ref(x, fn, num_splits)  # float64 on x's device
    out, sq = out.double(), sq.double()
    ro = ro.reshape(out.shape)
    rs = rs.reshape(sq.shape)
    assert not torch.isnan(out).any(), "out: not every element written"
    assert not torch.isnan(sq).any(), "sqrsum: not every element written"
    # per-split bound, A computed over the split's own slice
    S = 1 if num_splits is None else num_splits
    A = hc_prenorm_abs_scale(x, fn, num_splits).reshape(out.shape)
    bf16x2 = os.environ.get("DSV4_HC_PRENORM_PRECISION", "bf16x2") == "bf16x2"
    tol = (2.0 ** -13 if bf16x2 else 1.5 * 2.0 ** -10) * A + 1e-30
    err = (out - ro).abs()
    assert (err <= tol).all(), f"out: max err/tol {float((err / tol).max()):.3g} (S={S})"
    torch.testing.assert_close(sq, rs, rtol=2e-5, atol=1e-30)


# ------------------------------------------------------------------- reference itself
def test_split_bounds_match_deepgemm_partition():
    # 256 blocks of 64 over 16 splits: 16 each; 5 blocks over 3 splits: 2, 2, 1
    assert split_bounds(16384, 16)[1] == (1024, 2048)
    assert split_bounds(320, 3) == [(0, 128), (128, 256), (256, 320)]
    assert split_bounds(128, 4) == [(0, 64), (64, 128), (128, 128), (128, 128)]
    assert split_bounds(200, None) == [(0, 200)]


# ------------------------------------------------------------------- CPU (interpreter) / GPU
@pytest.mark.parametrize("num_splits", SPLITS)
@pytest.mark.parametrize("m", [1, 7, 33])
def test_small_k(device, m, num_splits):
    K = 320 if device == "cpu" else 16384
    x, fn = _inputs(m, K, device=device, seed=m)
    S = num_splits or 1
    out, sq = _poisoned(m, 24, S, device, flat=num_splits is None)
    assert hp.hc_prenorm_gemm(x, fn, out, sq, num_splits) is None
    _check(x, fn, out, sq, num_splits)


@pytest.mark.parametrize("mode", ["bf16x2", "tf32"])
def test_precision_modes(device, monkeypatch, mode):
    monkeypatch.setenv("DSV4_HC_PRENORM_PRECISION", mode)
    x, fn = _inputs(5, 200, device=device, seed=3)  # K not a multiple of 64
    out, sq = _poisoned(5, 24, 3, device)
    hp.hc_prenorm_gemm(x, fn, out, sq, 3)
    _check(x, fn, out, sq, 3)


def test_empty_splits_write_zero(device):
    # 2 K blocks over 4 splits: splits 2 and 3 are empty and must hold 0
    x, fn = _inputs(3, 128, device=device)
    out, sq = _poisoned(3, 24, 4, device)
    hp.tf32_hc_prenorm_gemm(x, fn, out, sq, num_splits=4)
    assert (out[2:] == 0).all() and (sq[2:] == 0).all()
    _check(x, fn, out, sq, 4)


def test_odd_n_strided_out_and_2d_out_with_one_split(device):
    x, fn = _inputs(9, 256, n=13, device=device)
    # out is a strided view (row stride 16) as a caller-owned buffer might be
    big = torch.full((2, 9, 16), float("nan"), device=device)
    out = big[:, :, :13]
    sq = torch.full((2, 9), float("nan"), device=device)
    hp.hc_prenorm_gemm(x, fn, out, sq, 2)
    _check(x, fn, out, sq, 2)
    assert torch.isnan(big[:, :, 13:]).all(), "wrote outside out"
    out2, sq2 = _poisoned(9, 13, 1, device, flat=True)
    hp.hc_prenorm_gemm(x, fn, out2, sq2, 1)
    _check(x, fn, out2, sq2, None)


_MMA = {"fma": False, "num_stages": 3}
_FMA = {"fma": True, "num_stages": 1}


@pytest.mark.parametrize("m, S, cfg", [
    (20, 2, {**_MMA, "p": 3, "block_m": 16, "r": 1}),           # 2 m tiles, rows chunk 16
    (20, 2, {**_MMA, "p": 5, "block_m": 16, "pb": 2, "r": 1}),  # 2 partials per load, ragged
    (7, 1, {**_MMA, "p": 9, "block_m": 16, "r": 1}),            # rows chunk 8 > m
    (1, 1, {**_MMA, "p": 10, "block_m": 16, "r": 1}),           # one row, P not a power of 2
    (40, 1, {**_MMA, "p": 4, "block_m": 32, "pb": 4, "r": 1}),
    (40, 1, {**_MMA, "p": 7, "block_m": 32, "r": 8}),           # 8 reducers x 4 rows (GPU)
    (70, 2, {**_MMA, "p": 5, "block_m": 64, "r": 4, "pb": 2}),  # 2 tiles, last one short
    (1, 1, {**_FMA, "p": 10, "block_m": 1, "r": 1}),            # FMA kernel, one row
    (3, 3, {**_FMA, "p": 3, "block_m": 4, "r": 4}),             # FMA, r clamped to P = 3 -> 2
    (13, 1, {**_FMA, "p": 6, "block_m": 8, "r": 8}),            # FMA, 2 tiles, 8 reducers
    (20, 2, {**_MMA, "p": 3, "block_m": 16, "r": 1, "presplit": True}),  # fn split by its own kernel
    (70, 1, {**_MMA, "p": 2, "block_m": 64, "r": 4, "presplit": True}),
    (33, 3, {**_MMA, "p": 1, "block_m": 32, "r": 1, "presplit": True}),  # no workspace
    (70, 2, {**_MMA, "p": 2, "block_m": 64, "r": 1, "presplit": True, "sq2d": True}),  # sqrsum reduced once
])
def test_internal_subsplits_and_repeat(device, m, S, cfg):
    # force the workspace + reduction (P > 1) and call twice, so the counters must
    # have been reset by the kernel itself. R > 1 (waiting reducers) runs on the GPU;
    # the interpreter runs programs one at a time, so there R is 1.
    x, fn = _inputs(m, 640, device=device, seed=5)
    for _ in range(2):
        out, sq = _poisoned(m, 24, S, device)
        hp.hc_prenorm_gemm(x, fn, out, sq, S, _config=cfg)
        _check(x, fn, out, sq, S)
    assert all(int(c.abs().sum()) == 0 for c in hp.api._COUNTERS.values())


def test_m_zero_returns_without_writing(device):
    x = torch.empty(0, 256, dtype=torch.bfloat16, device=device)
    fn = torch.randn(24, 256, device=device)
    out = torch.empty(4, 0, 24, device=device)
    sq = torch.empty(4, 0, device=device)
    assert hp.tf32_hc_prenorm_gemm(x, fn, out, sq, num_splits=4) is None
    # SGLang's wrapper returns before any check
    assert ad.sglang_tf32_hc_prenorm_gemm(x, fn, None, None, 4) is None


def test_sglang_shim_signature(device):
    import inspect

    assert list(inspect.signature(hp.tf32_hc_prenorm_gemm).parameters) == \
        ["a", "b", "d", "sqr_sum", "num_splits"]
    assert inspect.signature(hp.tf32_hc_prenorm_gemm).parameters["num_splits"].default is None
    assert list(inspect.signature(ad.sglang_tf32_hc_prenorm_gemm).parameters) == \
        ["x", "fn", "out", "sqrsum", "num_splits"]
    x, fn = _inputs(2, 128, device=device)
    out, sq = _poisoned(2, 24, 1, device, flat=True)
    ad.sglang_tf32_hc_prenorm_gemm(x, fn, out, sq, None)
    _check(x, fn, out, sq, None)


@pytest.mark.parametrize(
    "what, arg",
    [
        ("x_dtype", "x"), ("x_ndim", "x"), ("fn_dtype", "fn"), ("fn_k", "fn"), ("fn_n", "fn"),
        ("out_dtype", "out"), ("out_shape", "out"), ("out_2d_many_splits", "out"),
        ("sq_dtype", "sqrsum"), ("sq_shape", "sqrsum"), ("splits_zero", "num_splits"),
        ("splits_bool", "num_splits"),
    ],
)
def test_errors_name_the_argument(device, what, arg):
    m, K, S = 3, 128, 2
    x, fn = _inputs(m, K, device=device)
    out = torch.empty(S, m, 24, device=device)
    sq = torch.empty(S, m, device=device)
    ns = S
    if what == "x_dtype":
        x = x.half()
    elif what == "x_ndim":
        x = x.view(1, m, K)
    elif what == "fn_dtype":
        fn = fn.bfloat16()
    elif what == "fn_k":
        fn = fn[:, :64]
    elif what == "fn_n":
        fn = torch.randn(40, K, device=device)
    elif what == "out_dtype":
        out = out.bfloat16()
    elif what == "out_shape":
        out = torch.empty(S, m, 25, device=device)
    elif what == "out_2d_many_splits":
        out = torch.empty(m, 24, device=device)
    elif what == "sq_dtype":
        sq = sq.double()
    elif what == "sq_shape":
        sq = torch.empty(S + 1, m, device=device)
    elif what == "splits_zero":
        ns = 0
    elif what == "splits_bool":
        ns = True
    with pytest.raises(UnsupportedCase, match=rf"hc_prenorm: {arg} "):
        hp.tf32_hc_prenorm_gemm(x, fn, out, sq, num_splits=ns)


# ------------------------------------------------------------------- GPU only
@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["auto", "triton", "cuda"])
@pytest.mark.parametrize("num_splits", SPLITS)
@pytest.mark.parametrize("m", [0, 1, 7, 128, 4096])
def test_gpu_full_k(monkeypatch, m, num_splits, impl):
    """DeepGEMM's entry point with each kernel (DSV4_HC_PRENORM_IMPL; auto: the compiled kernel where
    auto_prefers_cuda says so, e.g. m >= 64 at n = 24 under DISABLE_MMA_V3=1, else Triton)."""
    monkeypatch.setenv("DSV4_HC_PRENORM_IMPL", impl)
    K = 16384
    x, fn = _inputs(m, K, device="cuda", seed=m + 1)
    S = num_splits or 1
    out, sq = _poisoned(m, 24, S, "cuda", flat=num_splits is None)
    hp.api.last_launch = None
    hp.tf32_hc_prenorm_gemm(x, fn, out, sq, num_splits=num_splits)
    torch.cuda.synchronize()
    if m:
        _check(x, fn, out, sq, num_splits)
        want = impl if impl != "auto" else (
            "cuda" if hp.auto_prefers_cuda(m, num_splits or 1, hp.mma_kind(x.device), 24, K) else "triton")
        assert hp.api.last_launch[0] == want, hp.api.last_launch


# the compiled kernel (csrc/hc_prenorm): odd m (partial 64-row tiles), n < 24, splits that are empty or
# uneven, forced sub-split counts (the last-block reduction, up to its 64-partial limit), K not a
# multiple of 64 (a short last block, a partial last 32-chunk)


# ---------------------------------------------------------------- GPU fuzz
# Random calls beyond the hand-picked cases: m, K, n, num_splits, kernel, forced sub-split count, strided x /
# fn / out / sqrsum, precision mode, and the grid sized for the SM counts of the cards we ship for (RTX PRO
# 6000: 188, RTX 5090: 170) or a small one, through hp.api.sm_count (the only place the SM count enters).
# Every third call also replayed from a CUDA graph. Seeds (8 per run by default) and failure naming: tests/fuzz.py.
def _fuzz_call(seed):
    import random
    r = random.Random(seed)
    m = 0 if r.random() < 0.05 else r.choice([r.randint(1, 70), int(2 ** r.uniform(0, 13)), r.randint(64, 700)])
    K = r.choice([16384, 16384, 8 * r.randint(1, 600), 32 * r.randint(1, 520), r.randint(1, 3000), 16416])
    n = r.choice([24, 24, 24, r.randint(1, hp.MAX_N)])
    num_splits = r.choice([None, None, 1, 2, 3, 4, 8, 16, r.randint(1, 70)])
    S = num_splits or 1
    impl = r.choice(["auto", "auto", "triton", "cuda"])
    tf32 = r.random() < 0.1
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, K, generator=g).bfloat16()
    fn = torch.randn(n, K, generator=g) * r.choice([0.05, 1.0])
    if r.random() < 0.25:   # x rows inside a wider tensor (a row stride the compiled kernel may not take)
        xb = torch.zeros(m, K + r.choice([1, 8, 64]), dtype=torch.bfloat16)
        xb[:, :K] = x
        x = xb.cuda()[:, :K]
    else:
        x = x.cuda()
    if r.random() < 0.25:
        fb = torch.zeros(n, K + r.choice([1, 4, 32]))
        fb[:, :K] = fn
        fn = fb.cuda()[:, :K]
    else:
        fn = fn.cuda()
    # out / sqrsum: 2-D / 1-D when S == 1 (DeepGEMM's num_splits None form) or 3-D / 2-D; contiguous or views
    # inside NaN-filled larger tensors, whose margins must stay NaN
    flat = S == 1 and r.random() < 0.5
    pad = r.choice([0, 0, 3])
    obig = torch.full((S, m, n + 2 * pad), float("nan"), device="cuda")
    out = obig[:, :, pad:pad + n]
    out = out[0] if flat else out
    if r.random() < 0.3:
        sbig = torch.full((m, S + 1), float("nan"), device="cuda")
        sq = sbig[:, :S].T
    else:
        sbig = torch.full((S, m), float("nan"), device="cuda")
        sq = sbig
    sq = sq[0] if flat else sq
    sms = r.choice(SM_COUNTS)
    cfg = None
    if impl == "cuda" and r.random() < 0.3:
        cfg = {"p": r.randint(1, 64)}
    elif impl == "cuda" and 1 <= m <= hp.FNROW_MAX_M and S == 1 and random.Random(seed * 11 + 3).random() < 0.3:
        cfg = {"fnrow": True}   # the whole-K kernel forced (own generator: the other draws stay those of before)
    elif impl == "cuda" and m <= 128 and r.random() < 0.4:   # the few-rows kernel forced, any rows per block
        cfg = {"small_rows": r.choice(hp.dispatch._SMALL_ROWS)}
        xr = random.Random(seed * 7 + 1)   # (own generator: the other draws stay those of before)
        cfg.update(xr.choice([{}, {"xchg": False}, {"xchg": True}, {"xchg": False, "atomic": False}]))
    mr = random.Random(seed * 13 + 5)   # forced 16 / 32-row MMA tiles (own generator: the other draws stay)
    if impl == "cuda" and (cfg is None or set(cfg) == {"p"}) and mr.random() < 0.3:
        rows = mr.choice(hp.MMA_ROWS)
        contiguous = pad == 0 and (S == 1 or out.stride(0) % 4 == 0)   # P = 1 stores whole float4 rows
        if m >= rows and n == 24 and K % 32 == 0 and ((cfg or {}).get("p", 1) > 1 or contiguous):
            cfg = {**(cfg or {}), "mma_rows": rows}
    desc = (f"seed {seed}: m={m} K={K} n={n} num_splits={num_splits} impl={impl} cfg={cfg} tf32={tf32} "
            f"x_stride={tuple(x.stride())} fn_stride={tuple(fn.stride())} out={tuple(out.shape)}{tuple(out.stride())} "
            f"sq={tuple(sq.shape)}{tuple(sq.stride())} sms={sms}")
    return x, fn, out, sq, num_splits, impl, cfg, tf32, sms, (obig, sbig), desc


@pytest.mark.gpu
@pytest.mark.parametrize("seed", SEEDS)
def test_gpu_fuzz(monkeypatch, seed):
    x, fn, out, sq, num_splits, impl, cfg, tf32, sms, bigs, desc = _fuzz_call(seed)
    print(desc)
    if tf32:
        monkeypatch.setenv("DSV4_HC_PRENORM_PRECISION", "tf32")
    patch_sm_count(monkeypatch, hp.api, "sm_count", sms)
    m, S = x.shape[0], num_splits or 1
    if impl == "cuda":
        why = hp.cuda_unsupported(x, fn, S)
        groups = -(-m // hp.dispatch._CUDA_ROWS) * S
        if cfg and cfg.get("p", 1) > 1 and groups > hp.dispatch._COUNTER_CAP:
            cfg = None
        if why is not None and m:   # the compiled kernel must refuse by name, and auto then runs Triton
            with pytest.raises(UnsupportedCase, match="cannot take this call"):
                hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl="cuda", _config=cfg)
            impl, cfg = "auto", None
    hp.api.last_launch = None
    if impl == "auto" and cfg is None:   # the default dispatch, called as SGLang calls it (no impl)
        hp.hc_prenorm_gemm(x, fn, out, sq, num_splits)
    else:
        hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl=impl, _config=cfg)
    torch.cuda.synchronize()
    if m == 0:
        assert hp.api.last_launch is None and all(t.isnan().all() for t in bigs), desc
        return
    # the test's own statement of the default rule for DeepSeek-V4's shape as SGLang calls it (docs/hc_prenorm.md,
    # dispatch rules): n = 24, K % 32 == 0, one split or splits of at most 256 (SGLang's 64 at K = 16384), bf16x2
    # precision: a compiled kernel at every m, on every GPU kind (on sm_90 Triton's wgmma kernel was 6-30x slower at
    # m = 64-2048 with this shape)
    dsv4_shape = (fn.shape[0] == 24 and x.shape[1] % 32 == 0 and not tf32
                  and (S == 1 or -(-x.shape[1] // 64) <= 4 * S))
    if impl == "auto" and cfg is None and dsv4_shape and hp.cuda_unsupported(x, fn, S) is None:
        assert hp.api.last_launch[0] == "cuda", f"the default dispatch ran {hp.api.last_launch}: {desc}"
    with named(f"{desc} ran {hp.api.last_launch}"):
        _check(x, fn, out, sq, num_splits)
    for big, view in zip(bigs, (out, sq)):   # nothing written outside the views
        mask = torch.ones_like(big, dtype=torch.bool)
        torch.as_strided(mask, view.shape, view.stride(), view.storage_offset()).fill_(False)
        assert big[mask].isnan().all(), f"wrote outside the {tuple(view.shape)} view: {desc}"
    assert all(int(c.abs().sum()) == 0 for c in hp.api._COUNTERS.values()), f"counters not reset: {desc}"
    assert all(int(b.view(torch.int32)[64:128].abs().sum()) == 0 for b in hp.api._XCHG.values()), \
        f"exchange tickets not reset: {desc}"
    if seed % 3 == 0:   # every third call also replayed from a CUDA graph: the same bits (fixed summation order)
        eo, es = out.clone(), sq.clone()
        atomic = hp.api.last_launch[0] == "cuda" and hp.api.last_launch[3] == "atomic"
        replay_on_poisoned(lambda: hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl=impl, _config=cfg),
                           lambda _: (out, sq))
        if atomic:   # the order of the atomic additions may differ between calls: float64 decides
            with named(f"{desc} replayed {hp.api.last_launch}"):
                _check(x, fn, out, sq, num_splits)
        else:
            assert torch.equal(out, eo) and torch.equal(sq, es), f"graph replay differs from eager: {desc}"
