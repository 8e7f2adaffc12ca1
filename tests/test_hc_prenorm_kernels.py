"""hc_prenorm's kernels on the GPU: the compiled MMA kernel with its sub-slices and counters, the few-rows and
whole-K kernels, tf32 mode, the Triton tile variants and CUDA-graph replay; tolerances as tests/test_hc_prenorm.py
states them."""

import pytest
import torch

from deepseek_v4_kernel.errors import UnsupportedCase
from fuzz import replay_on_poisoned
from test_hc_prenorm import _FMA, _MMA, _check, _inputs, _poisoned, _strided_out  # the op's shared test helpers

from deepseek_v4_kernel.ops import hc_prenorm as hp
from deepseek_v4_kernel.patch import adapters as ad   # SGLang's signatures; registers its determinism switch


@pytest.mark.gpu
@pytest.mark.parametrize("m, K, n, num_splits, p", [
    (1, 16384, 24, None, 2), (7, 16384, 24, 16, 2), (65, 16384, 24, None, None),
    (130, 16384, 24, 3, None), (512, 16384, 24, None, None), (512, 16384, 24, 16, None),
    (512, 16384, 24, None, 1), (512, 16384, 24, None, 7), (100, 16384, 24, 2, 64),
    (4097, 16384, 24, None, None), (2048, 16384, 24, 4, None), (300, 1000, 24, 3, 5),
    (70, 200, 13, 2, 2), (64, 128, 24, 4, 3), (33, 16384, 1, 64, 1), (129, 16384, 17, 1, 8), (7, 16384, 24, 16, 1),
    # the kFast kernel (csrc/hc_prenorm/kernel.cuh; P = 1, m >= 64, K % 32 == 0, n = 24, contiguous out):
    # m = 64 exactly, a last tile shifted back by 63 / 1 rows, K % 64 == 32 (a short last 64-block), splits
    # that are empty (S > K / 64), 2-D out
    (64, 16384, 24, 3, 1), (65, 16384, 24, None, 1), (127, 1024, 24, 2, 1), (1000, 2080, 24, 5, 1),
    (129, 128, 24, 4, 1), (4095, 16384, 24, 2, None),
])
def test_gpu_cuda_kernel(m, K, n, num_splits, p):
    x, fn = _inputs(m, K, n=n, device="cuda", seed=m + K + n)
    S = num_splits or 1
    for _ in range(2):  # the counters must have been reset by the kernel
        out, sq = _poisoned(m, n, S, "cuda", flat=num_splits is None)
        hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl="cuda", _config={"p": p} if p else None)
        torch.cuda.synchronize()
        assert hp.api.last_launch[0] == "cuda"
        _check(x, fn, out, sq, num_splits)
    assert all(int(c.abs().sum()) == 0 for c in hp.api._COUNTERS.values())


# the few-rows kernel (csrc/hc_prenorm/kernel_small.cuh): SGLang's decode calls (64 splits, m <= 64), each
# instance (R = 1 .. 16 rows per block, forced) with a partial last row group, n < 24 (fn rows >= n skipped),
# K not a multiple of 64 (a short last block), empty splits (more splits than 64-blocks), splits of 1024 (more
# than one round of loads per lane), wide splits cut into sub-slices (num_splits None, 2-D out)
# the few-rows kernel with its fn rows over three or six blocks (params fn_groups, kernel_small.cuh kFG; forced): every
# instance (R = 2 / 4 / 8) with a partial last row block and more rows than R (several row blocks), n < 24 and n <= 4
# (whole fn groups past n), a short last 64-block, empty splits, 1024-wide splits (several rounds), strided out /
# sqrsum (nothing written beside them); refused by name where it does not apply
@pytest.mark.gpu
@pytest.mark.parametrize("groups", [3, 6])
@pytest.mark.parametrize("m, K, n, num_splits, rows", [
    (1, 16384, 24, 64, 2), (2, 16384, 24, 64, 2), (3, 16384, 24, 64, 4), (8, 16384, 24, 64, 8),
    (5, 16384, 24, 64, 8), (13, 16384, 24, 64, 4), (17, 16384, 24, 64, 8), (7, 16384, 17, 64, 8),
    (6, 16384, 5, 64, 4), (4, 16400, 24, 64, 4), (3, 1000, 24, 16, 2), (9, 256, 13, 300, 8), (8, 16384, 24, 16, 8),
    (5, 16384, 3, 64, 2),
])
def test_gpu_small_kernel_fn_groups(m, K, n, num_splits, rows, groups):
    x, fn = _inputs(m, K, n=n, device="cuda", seed=m + K + n + 2)
    for strided in (False, True):
        if strided:
            out, sq, margins_nan = _strided_out(num_splits, m, 3, n=n)
        else:
            out, sq = _poisoned(m, n, num_splits, "cuda")
        hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl="cuda", _config={"small_rows": rows, "fn_groups": groups})
        torch.cuda.synchronize()
        assert hp.api.last_launch == ("cuda", 1, rows, None, None) and hp.api.last_fn_groups == groups
        _check(x, fn, out, sq, num_splits)
        assert not strided or margins_nan()
    out, sq = _poisoned(m, n, num_splits, "cuda")
    for bad in ({"small_rows": 1, "fn_groups": groups}, {"small_rows": 16, "fn_groups": groups},
                {"small_rows": rows, "fn_groups": 2}):
        with pytest.raises(UnsupportedCase, match="fn_groups"):
            hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl="cuda", _config=bad)
    if hp.small_sub_splits(K, 1, n) > 1:   # sub-slices of one wide split: not with fn groups
        with pytest.raises(UnsupportedCase, match="fn_groups"):
            hp.hc_prenorm_gemm(x, fn, out[0], sq[0], None, impl="cuda", _config={"small_rows": 2, "fn_groups": groups})


@pytest.mark.gpu
@pytest.mark.parametrize("m, K, n, num_splits, rows", [
    (1, 16384, 24, 64, None), (2, 16384, 24, 64, None), (8, 16384, 24, 64, None), (33, 16384, 24, 64, None),
    (64, 16384, 24, 64, None), (1, 16384, 24, 16, None), (64, 16384, 24, 16, None), (5, 16400, 24, 64, None),
    # num_splits None / few splits (SGLang's hc_pre DeepGEMM branch): sub-slices of 256, the reduce grid sums them
    (1, 16384, 24, None, None), (8, 16384, 24, None, None), (63, 16384, 24, None, None), (5, 16416, 24, None, None),
    (3, 4096, 24, 4, None), (7, 16384, 17, 16, None), (30, 4000, 24, 1, None), (64, 16384, 24, None, 1),
    (13, 16384, 24, 64, 1), (13, 16384, 24, 64, 2), (13, 16384, 24, 64, 4), (13, 16384, 24, 64, 8),
    (13, 16384, 24, 64, 16), (20, 16384, 13, 64, 16), (45, 16384, 17, 64, 16), (100, 4096, 24, 16, 16),
    (9, 16384, 13, 64, 8), (2, 16384, 1, 32, 1), (3, 1000, 24, 16, 2),
    (3, 128, 24, 4, 1), (17, 256, 24, 300, 16), (3, 512, 24, None, 2), (40, 4096, 23, 7, 4),
])
def test_gpu_small_kernel(m, K, n, num_splits, rows):
    x, fn = _inputs(m, K, n=n, device="cuda", seed=m + K + n + 1)
    S = num_splits or 1
    # mma_rows 0: the few-rows kernel's own rule, without the 16 / 32-row MMA tiles that "auto" takes from m = 16
    # (test_gpu_mma_rows); the SGLang call below runs whatever auto takes
    cfg = {"mma_rows": 0} if rows is None else {"small_rows": rows}
    P = hp.small_sub_splits(K, S, n) or 1
    # sub-slices of one split (n = 24): added by float atomics (contiguous out), with the rule's rows per block
    atomic = P > 1 and n == 24 and S == 1
    sms = hp.api.sm_count(x.device)
    fg_rows, groups = (0, 1) if rows or P > 1 else hp.dispatch.fn_groups_pick(m, K, S, sms, n)   # fn over blocks
    want = rows or fg_rows or (hp.small_rows(m, K, S, sms, n) if atomic
                               else hp.decode_rows(m, K, S, sms, n, hp.exchange_enabled(m)))
    assert want in hp.dispatch._SMALL_ROWS
    fnrow = hp.fnrow_enabled(m, K, S, n, cfg)   # "auto" at m <= FNROW_AUTO_MAX_M with one split: the whole-K kernel
    expect = ("cuda", 1, "fnrow", None, None) if fnrow else ("cuda", P, want, None if P == 1 else "atomic", None)
    out, sq = _poisoned(m, n, S, "cuda", flat=num_splits is None)
    hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl="cuda", _config=cfg)
    torch.cuda.synchronize()
    assert hp.api.last_launch == expect and hp.api.last_fn_groups == (groups if fg_rows and not fnrow else 1)
    _check(x, fn, out, sq, num_splits)
    if rows is None and num_splits in (64, None):   # what SGLang's decode gets under impl "auto"
        out2, sq2 = _poisoned(m, n, S, "cuda", flat=num_splits is None)
        pick = hp.mma_rows_pick(m, K, S, n, sms, out2 if out2.dim() == 3 else out2.unsqueeze(0), hp.atomic_enabled())
        if pick:   # the 16 / 32-row MMA tiles (m >= 16, n = 24, K % 32 == 0): another kernel, float64 decides
            expect = ("cuda", pick[1], 0, None if pick[1] == 1 else "atomic", pick[0])
        hp.tf32_hc_prenorm_gemm(x, fn, out2, sq2, num_splits)
        torch.cuda.synchronize()
        assert hp.api.last_launch == expect
        if expect[3] == "atomic" or pick:   # the order of the atomic additions may differ: float64 decides
            _check(x, fn, out2, sq2, num_splits)
        else:
            assert torch.equal(out2, out) and torch.equal(sq2, sq)
    if fnrow:   # the sub-slices instead (forced rows per block): another sum order, checked against float64 alone
        out, sq = _poisoned(m, n, S, "cuda", flat=num_splits is None)
        hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl="cuda", _config={"small_rows": want})
        torch.cuda.synchronize()
        _check(x, fn, out, sq, num_splits)
    if P > 1:   # the exchange and the reduce grid: one fixed sum order, one result; the atomic sum against float64
        fixed = None
        for cfg in ({"xchg": True}, {"xchg": False, "atomic": False}, {"atomic": True}):
            if cfg.get("atomic") and not atomic:
                continue
            out3, sq3 = _poisoned(m, n, S, "cuda", flat=num_splits is None)
            hp.hc_prenorm_gemm(x, fn, out3, sq3, num_splits, impl="cuda", _config={"small_rows": want, **cfg})
            torch.cuda.synchronize()
            how = "atomic" if cfg.get("atomic") else "xchg" if cfg.get("xchg") and m <= hp.XCHG_MAX_M else "reduce"
            assert hp.api.last_launch == ("cuda", P, want, how, None), cfg
            _check(x, fn, out3, sq3, num_splits)
            if how != "atomic":
                fixed = fixed or (out3, sq3)
                assert torch.equal(out3, fixed[0]) and torch.equal(sq3, fixed[1]), cfg


@pytest.mark.gpu
def test_gpu_small_kernel_strided_out_and_bad_rows():
    x, fn = _inputs(10, 16384, n=24, device="cuda", seed=11)
    out, sq, margins_nan = _strided_out(64, 10, 5)   # row stride 32, offset 5; sqrsum strides (1, 64)
    hp.hc_prenorm_gemm(x, fn, out, sq, 64)
    torch.cuda.synchronize()
    assert hp.api.last_launch[0] == "cuda" and hp.api.last_launch[2] > 0, hp.api.last_launch
    _check(x, fn, out, sq, 64)
    assert margins_nan(), "wrote outside out"
    o, q = _poisoned(10, 24, 64, "cuda")
    for bad in (3, 32, -1):
        with pytest.raises(UnsupportedCase, match="hc_prenorm: _config small_rows "):
            hp.hc_prenorm_gemm(x, fn, o, q, 64, impl="cuda", _config={"small_rows": bad})
    with pytest.raises(UnsupportedCase, match="hc_prenorm: _config small_rows "):
        hp.hc_prenorm_gemm(x, fn, o, q, 64, impl="cuda", _config={"small_rows": 4, "p": 2})
    hp.hc_prenorm_gemm(x, fn, o, q, 64, impl="cuda", _config={"small_rows": 0})   # the MMA kernel
    torch.cuda.synchronize()
    assert hp.api.last_launch[0] == "cuda" and hp.api.last_launch[2] == 0, hp.api.last_launch
    _check(x, fn, o, q, 64)


@pytest.mark.gpu
def test_gpu_cuda_kernel_strided_out_and_empty_splits():
    x, fn = _inputs(150, 256, n=24, device="cuda", seed=5)
    out, sq, margins_nan = _strided_out(4, 150, 3)   # row stride 32, offset 3; sqrsum [4, 150], strides (1, 4)
    hp.hc_prenorm_gemm(x, fn, out, sq, 4, impl="cuda")  # 4 64-blocks over 4 splits
    torch.cuda.synchronize()
    _check(x, fn, out, sq, 4)
    assert margins_nan(), "wrote outside out"
    x, fn = _inputs(150, 128, device="cuda", seed=6)   # 2 blocks over 4 splits: 2, 3 empty -> 0
    out, sq = _poisoned(150, 24, 4, "cuda")
    hp.hc_prenorm_gemm(x, fn, out, sq, 4, impl="cuda")
    torch.cuda.synchronize()
    assert (out[2:] == 0).all() and (sq[2:] == 0).all()
    _check(x, fn, out, sq, 4)
    # the kFast kernel with a strided sqrsum (its out rows are float4 stores, its sqrsum values scalar ones)
    x, fn = _inputs(150, 256, n=24, device="cuda", seed=7)
    out = torch.full((4, 150, 24), float("nan"), device="cuda")
    sqb = torch.full((150, 4), float("nan"), device="cuda")
    hp.hc_prenorm_gemm(x, fn, out, sqb.T, 4, impl="cuda", _config={"p": 1})
    torch.cuda.synchronize()
    _check(x, fn, out, sqb.T, 4)
    # kFast with sub-slices (P = 3): partials in the workspace, the reduce kernel writes the strided out / sqrsum
    x, fn = _inputs(150, 4096, n=24, device="cuda", seed=8)
    out, sq, margins_nan = _strided_out(4, 150, 3)
    hp.hc_prenorm_gemm(x, fn, out, sq, 4, impl="cuda", _config={"p": 3})
    torch.cuda.synchronize()
    assert hp.api.last_launch == ("cuda", 3, 0, "reduce", 64)
    _check(x, fn, out, sq, 4)
    assert margins_nan(), "wrote outside out"


# which kernels a compiled call launches (csrc/hc_prenorm/hc_prenorm.cu): sub-slices (P > 1) of kFast shapes
# (m >= 64, K % 32 == 0, n = 24) go through the reduce kernel, or, for one split and a contiguous out, the zero kernel
# and the kFast kernel's atomic epilogue (unless the fixed order is asked for), other P > 1 shapes through the general
# kernel's last-block sum, P = 1 never reduces
_KFAST, _REDUCE = "hc_prenorm_kernel<true>", "hc_prenorm_reduce_kernel"
_ATOMIC = {"hc_prenorm_kernel<true, atomic>", "hc_prenorm_zero_kernel"}


@pytest.mark.gpu
@pytest.mark.parametrize("m, K, n, S, p, atomic, kernels", [
    (512, 16384, 24, None, 16, None, _ATOMIC),
    (512, 16384, 24, None, 16, False, {_KFAST, _REDUCE}),
    (64, 4096, 24, 2, 3, None, {_KFAST, _REDUCE}),
    (100, 256, 24, 2, 3, None, {_KFAST, _REDUCE}),   # empty sub-slices
    (96, 16416, 24, None, 5, None, _ATOMIC),          # K % 64 == 32
    (96, 16416, 24, None, 5, False, {_KFAST, _REDUCE}),
    (512, 16384, 24, 16, 1, None, {_KFAST}),
    (300, 1000, 24, 3, 5, None, {"hc_prenorm_kernel<false>"}),      # K % 32 != 0
    (129, 16384, 17, 1, 8, None, {"hc_prenorm_kernel<false>"}),     # n < 24
    (63, 16384, 24, None, 4, None, {"hc_prenorm_kernel<false>"}),   # m < 64
])
def test_gpu_cuda_kernels_launched(m, K, n, S, p, atomic, kernels):
    from torch.profiler import ProfilerActivity, profile
    x, fn = _inputs(m, K, n=n, device="cuda", seed=3)
    out, sq = _poisoned(m, n, S or 1, "cuda", flat=S is None)
    cfg = {"p": p, **({} if atomic is None else {"atomic": atomic})}
    hp.hc_prenorm_gemm(x, fn, out, sq, S, impl="cuda", _config=cfg)   # counters allocated eagerly
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    sq.fill_(float("nan"))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        hp.hc_prenorm_gemm(x, fn, out, sq, S, impl="cuda", _config=cfg)
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if "hc_prenorm" in e.name}
    got = {(_REDUCE if "reduce" in nm else "hc_prenorm_zero_kernel" if "zero" in nm else
            "hc_prenorm_kernel<true, atomic>" if "<true, true, 64>" in nm else
            _KFAST if "<true, false, 64>" in nm else "hc_prenorm_kernel<false>" if "<false, false, 64>" in nm else nm)
           for nm in names}
    assert got == kernels, sorted(names)
    assert hp.api.last_launch[3] == ("atomic" if kernels == _ATOMIC else None if p == 1 else "reduce"), hp.api.last_launch
    _check(x, fn, out, sq, S)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["n25", "k_not_8", "x_misaligned", "fn_strided", "tf32"])
def test_gpu_cuda_unsupported_names_why_and_auto_falls_back(monkeypatch, case):
    m, K, n = 256, 1024, 24
    x, fn = _inputs(m, K + 8, n=n, device="cuda", seed=2)
    x, fn = x[:, :K], fn[:, :K]     # rows of K + 8: still 16-byte aligned
    why = {"n25": "fn has 25 rows", "k_not_8": "not a multiple of 8", "x_misaligned": "x rows",
           "fn_strided": "fn rows", "tf32": "tf32"}[case]
    if case == "n25":
        fn = torch.randn(25, K, device="cuda") * 0.05
        n = 25
    elif case == "k_not_8":
        x, fn = _inputs(m, K - 4, device="cuda", seed=3)
    elif case == "x_misaligned":
        x = _inputs(m, K + 1, device="cuda", seed=4)[0][:, 1:]
    elif case == "fn_strided":
        fn = (torch.randn(2 * K, n, device="cuda") * 0.05).T[:, ::2]
    else:
        monkeypatch.setenv("DSV4_HC_PRENORM_PRECISION", "tf32")
    out, sq = _poisoned(m, n, 2, "cuda")
    with pytest.raises(UnsupportedCase, match=f"impl 'cuda' cannot take this call: .*{why}"):
        hp.hc_prenorm_gemm(x, fn, out, sq, 2, impl="cuda")
    hp.hc_prenorm_gemm(x, fn, out, sq, 2)  # auto: the Triton kernel takes it
    torch.cuda.synchronize()
    assert hp.api.last_launch[0] == "triton"
    _check(x, fn, out, sq, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 64, 512, 16384])
def test_gpu_tf32_mode_and_large_m(monkeypatch, m):
    monkeypatch.setenv("DSV4_HC_PRENORM_PRECISION", "tf32")
    x, fn = _inputs(m, 16384, device="cuda", seed=7)
    out, sq = _poisoned(m, 24, 4, "cuda")
    hp.hc_prenorm_gemm(x, fn, out, sq, 4)
    torch.cuda.synchronize()
    _check(x, fn, out, sq, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("m, num_splits, cfg", [
    (1, None, {**_FMA, "block_m": 1, "p": 256, "r": 1, "num_warps": 4}),
    (4, None, {**_FMA, "block_m": 4, "p": 256, "r": 4, "num_warps": 4}),
    (8, 2, {**_FMA, "block_m": 8, "p": 64, "r": 8, "num_warps": 8}),
    (16, None, {**_MMA, "block_m": 16, "p": 256, "r": 8}),
    (64, None, {**_MMA, "block_m": 64, "p": 128, "r": 32, "num_stages": 2}),
    (64, None, {**_MMA, "block_m": 64, "block_k": 128, "p": 128, "r": 32, "num_warps": 8}),
    (100, 3, {**_MMA, "block_m": 32, "p": 20, "r": 16}),
    (512, None, {**_MMA, "block_m": 128, "p": 32, "r": 16, "num_warps": 8}),
    (512, None, {**_MMA, "block_m": 64, "p": 64, "r": 16, "gel": 4096}),
    (1000, None, {**_MMA, "block_m": 64, "p": 16, "r": 8}),
    (8192, None, {**_MMA, "block_m": 128, "p": 2, "r": 1, "num_warps": 8}),
    (64, None, {**_MMA, "block_m": 64, "p": 128, "r": 32, "num_stages": 2, "presplit": True}),
    (512, None, {**_MMA, "block_m": 64, "p": 32, "r": 16, "num_stages": 4, "presplit": True}),
    (2000, 2, {**_MMA, "block_m": 64, "p": 16, "r": 1, "presplit": True}),
    (8192, None, {**_MMA, "block_m": 128, "p": 2, "r": 1, "num_warps": 8, "presplit": True}),
    (4097, None, {**_MMA, "block_m": 64, "p": 1, "r": 1, "num_stages": 4, "presplit": True}),
    (8192, None, {**_MMA, "block_m": 128, "p": "fill", "r": 1, "num_warps": 8, "presplit": True, "sq2d": True}),
    (513, 2, {**_MMA, "block_m": 64, "p": 16, "r": 8, "sq2d": True}),
])
def test_gpu_variants_full_k(m, num_splits, cfg):
    """The kernel variants the tile table and the bench sweep use, at DSV4's K, called
    twice (counters reset by the kernel, also the R > 1 ``done`` counters)."""
    x, fn = _inputs(m, 16384, device="cuda", seed=m + 3)
    S = num_splits or 1
    for _ in range(2):
        out, sq = _poisoned(m, 24, S, "cuda", flat=num_splits is None)
        hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, _config=cfg)
        torch.cuda.synchronize()
        _check(x, fn, out, sq, num_splits)
    assert all(int(c.abs().sum()) == 0 for c in hp.api._COUNTERS.values())


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 64, 512, 4096])
def test_gpu_legacy_config(m):
    """The first heuristic stays selectable (``legacy_config`` as ``_config``)."""
    x, fn = _inputs(m, 16384, device="cuda", seed=m + 9)
    out, sq = _poisoned(m, 24, 1, "cuda", flat=True)
    cfg = hp.legacy_config(m, 16384, 1, torch.cuda.get_device_properties(0).multi_processor_count)
    hp.hc_prenorm_gemm(x, fn, out, sq, None, _config=cfg)
    torch.cuda.synchronize()
    _check(x, fn, out, sq, None)


@pytest.mark.gpu
@pytest.mark.parametrize("m, cfg", [
    (8, None),                                                          # the tile table
    (1, {**_FMA, "block_m": 1, "p": 256, "r": 1, "num_warps": 4}),
    (8, {**_FMA, "block_m": 8, "p": 128, "r": 8, "num_warps": 8}),     # waiting reducers
    (64, {**_MMA, "block_m": 64, "p": 128, "r": 32, "num_stages": 2}),
    (64, hp.legacy_config(64, 16384, 1, 132)),
    (512, {**_MMA, "block_m": 64, "p": 32, "r": 16, "num_stages": 4, "presplit": True}),
    (512, "cuda"),                                                      # compiled kernel, P > 1
    (8192, "cuda"),                                                     # compiled kernel, P = 1
    (1, "cuda"), (12, "cuda"),                                          # whole-K kernel; few-rows kernel, 64 sub-slices
    (12, "cuda atomic"), (512, "cuda atomic"),                          # the same sub-slices added by atomics
    (33, "cuda"), (33, "cuda atomic"),                                  # 16-row MMA tiles, reduce grid / atomics
])
def test_gpu_cuda_graph_replay_and_determinism(monkeypatch, m, cfg):
    """Graph replays onto poisoned outputs give the eager call's bits, with every fixed-order sum (the compiled
    kernels with DSV4_HC_PRENORM_ATOMIC=0, whose default for num_splits None adds sub-slices by float atomics);
    the atomic sum ("cuda atomic") is checked against float64 on every replay instead (its zero kernel must clear
    the poisoned outputs each time)."""
    K = 16384
    x, fn = _inputs(m, K, device="cuda", seed=11)
    out = torch.empty(m, 24, device="cuda")
    sq = torch.empty(m, device="cuda")
    atomic = cfg == "cuda atomic"
    monkeypatch.setenv("DSV4_HC_PRENORM_ATOMIC", "1" if atomic else "0")

    def call():
        if cfg in ("cuda", "cuda atomic"):
            hp.hc_prenorm_gemm(x, fn, out, sq, None, impl="cuda")
            assert (hp.api.last_launch[3] == "atomic") == atomic, hp.api.last_launch
        else:
            hp.hc_prenorm_gemm(x, fn, out, sq, None, _config=cfg)

    call()  # eager first: allocates the counters
    first = out.clone(), sq.clone()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()  # warm-up on the capture stream
        with torch.cuda.graph(g, stream=s):
            call()
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(3):
        out.fill_(float("nan"))
        sq.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        if atomic:
            _check(x, fn, out, sq, None)
        else:
            assert torch.equal(out, first[0]) and torch.equal(sq, first[1]), "not deterministic"
    x2, fn2 = _inputs(m, K, device="cuda", seed=12)
    x.copy_(x2)
    fn.copy_(fn2)  # new weights in place: a pre-split fn must be split again on every replay
    g.replay()
    torch.cuda.synchronize()
    _check(x, fn, out, sq, None)


@pytest.mark.gpu
def test_gpu_small_kernel_first_call_inside_capture(monkeypatch):
    """num_splits None at decode on a stream whose first call is captured (no workspace for that stream yet: one
    from the graph's pool; no exchange buffer: the reduce grid): the few-rows kernel's 64 sub-slices and the
    reduce grid, replayed, give the eager call's numbers (the exchange's) bit for bit."""
    monkeypatch.setattr(hp.api, "_WORKSPACES", {})   # torch's streams come from a pool: make this one's workspace new
    monkeypatch.setattr(hp.api, "_XCHG", {})         # and no exchange buffer: it cannot be zeroed inside a capture
    m, K = 9, 16384
    x, fn = _inputs(m, K, device="cuda", seed=21)
    out, sq = _poisoned(m, 24, 1, "cuda", flat=True)
    assert not hp.api._WORKSPACES, "no workspace yet, for any stream"
    xchg = {"xchg": True}   # (whatever rows per block this GPU's rule picks)
    replay_on_poisoned(lambda: hp.hc_prenorm_gemm(x, fn, out, sq, None, impl="cuda", _config=xchg),
                       lambda _: (out, sq), warm_up=False)
    R = hp.decode_rows(m, K, 1, hp.api.sm_count(x.device))
    assert hp.api.last_launch == ("cuda", 64, R, "reduce", None)
    assert not hp.api._XCHG
    _check(x, fn, out, sq, None)
    out2, sq2 = _poisoned(m, 24, 1, "cuda", flat=True)
    hp.hc_prenorm_gemm(x, fn, out2, sq2, None, impl="cuda", _config=xchg)   # eager, on the default stream: the exchange
    torch.cuda.synchronize()
    assert hp.api.last_launch == ("cuda", 64, R, "xchg", None)
    assert torch.equal(out2, out) and torch.equal(sq2, sq)


@pytest.mark.gpu
@pytest.mark.parametrize("m, K, n, num_splits", [
    (1, 16384, 24, None), (2, 16384, 24, None), (1, 16384, 24, 1), (2, 16416, 24, None), (2, 1000, 13, None),
    (1, 8, 1, 1), (2, 8, 24, None), (1, 4104, 24, None), (2, 65536, 7, 1),
])
def test_gpu_fnrow_kernel(m, K, n, num_splits):
    """The whole-K kernel (one block per fn row, no partials) against float64: odd K (K % 4096 != 0: the last
    round's predicated loads; K = 8: one float4 per row), fewer fn rows, 2-D and 3-D out (num_splits None / 1), a
    strided out and sqrsum inside NaN-filled tensors whose margins must stay NaN, graph replay = eager bits."""
    x, fn = _inputs(m, K, n=n, device="cuda", seed=7 * m + K + n)
    S = 1
    cfg = {"fnrow": True}
    if num_splits is None:
        big = torch.full((m, n + 5), float("nan"), device="cuda")
        out = big[:, 2:2 + n]
        sbig = torch.full((m, 3), float("nan"), device="cuda")
        sq = sbig[:, 1]
        margins = lambda: bool(big[:, :2].isnan().all() and big[:, 2 + n:].isnan().all()
                               and sbig[:, 0].isnan().all() and sbig[:, 2].isnan().all())
    else:
        out, sq, margins = _strided_out(S, m, 3, n=n)
    hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl="cuda", _config=cfg)
    torch.cuda.synchronize()
    assert hp.api.last_launch == ("cuda", 1, "fnrow", None, None)
    _check(x, fn, out, sq, num_splits)
    assert margins(), "wrote outside out / sqrsum"
    eo, es = out.clone(), sq.clone()
    replay_on_poisoned(lambda: hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl="cuda", _config=cfg),
                       lambda _: (out, sq))
    assert torch.equal(out, eo) and torch.equal(sq, es)
    if hp.fnrow_enabled(m, K, S, n):   # and what "auto" gives there
        out2, sq2 = torch.full_like(out, float("nan")), torch.full_like(sq, float("nan"))
        hp.hc_prenorm_gemm(x, fn, out2, sq2, num_splits)
        torch.cuda.synchronize()
        assert hp.api.last_launch == ("cuda", 1, "fnrow", None, None) and torch.equal(out2, eo) and torch.equal(sq2, es)


@pytest.mark.gpu
def test_gpu_fnrow_refuses_by_name():
    """_config fnrow where the whole-K kernel cannot go: too many rows, several splits, a forced path besides."""
    x, fn = _inputs(3, 16384, device="cuda", seed=3)
    o, q = _poisoned(3, 24, 1, "cuda", flat=True)
    with pytest.raises(UnsupportedCase, match="hc_prenorm: _config fnrow "):
        hp.hc_prenorm_gemm(x, fn, o, q, None, impl="cuda", _config={"fnrow": True})
    o, q = _poisoned(2, 24, 2, "cuda")
    with pytest.raises(UnsupportedCase, match="hc_prenorm: _config fnrow "):
        hp.hc_prenorm_gemm(x[:2], fn, o, q, 2, impl="cuda", _config={"fnrow": True})
    o, q = _poisoned(2, 24, 1, "cuda", flat=True)
    with pytest.raises(UnsupportedCase, match="hc_prenorm: _config fnrow "):
        hp.hc_prenorm_gemm(x[:2], fn, o, q, None, impl="cuda", _config={"fnrow": True, "small_rows": 1})
    with pytest.raises(UnsupportedCase, match="hc_prenorm: _config fnrow "):
        hp.hc_prenorm_gemm(x[:2], fn, o, q, None, impl="cuda", _config={"fnrow": True, "mma_rows": 16})
    with pytest.raises(UnsupportedCase, match="hc_prenorm: _config mma_rows "):   # not the whole-K kernel instead
        hp.hc_prenorm_gemm(x[:2], fn, o, q, None, impl="cuda", _config={"mma_rows": 16})
