"""hc_prenorm's sums of K sub-slices on the GPU (float atomics, the few-rows kernel's exchange), the 16 / 32-row MMA
tiles, and the shared-memory limit of every Triton variant; tolerances as tests/test_hc_prenorm.py states them."""

import pytest
import torch

from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.ops._workspace import stream_key
from fuzz import replay_on_poisoned
from test_hc_prenorm import _check, _inputs, _poisoned, _strided_out  # the op's shared test helpers

from deepseek_v4_kernel.ops import hc_prenorm as hp
from deepseek_v4_kernel.patch import adapters as ad   # SGLang's signatures; registers its determinism switch


@pytest.mark.gpu
@pytest.mark.parametrize("m, K, rows, pad", [
    (3, 16384, None, 0), (8, 16384, None, 0), (17, 16384, None, 4), (40, 16384, 8, 0), (63, 16384, None, 0),
    (5, 16416, 16, 4), (33, 4000, 1, 0), (64, 16384, None, 0), (200, 16384, None, 0), (512, 16416, None, 0),
    (64, 16384, 2, 4), (1, 16384, 4, 0),
])
def test_gpu_atomic_sum(m, K, rows, pad):
    """num_splits None's sub-slices added into out by float4 atomics after the zero kernel (the few-rows kernel at
    m <= 63 or any forced rows per block, the kFast MMA kernel from m = 64): against float64 on poisoned outputs,
    odd K (a short last sub-slice), out as a view with m stride 24 + pad inside a NaN-filled tensor whose margins
    must stay NaN, twice in a row (the zero kernel clears the first call's sums), graph replays onto poisoned
    outputs; the fixed-order sum of the same call agrees with it to fp32 rounding."""
    x, fn = _inputs(m, K, device="cuda", seed=m * 7 + K + pad)
    mma = m >= 64 and rows is None
    if mma:   # the kFast kernel's epilogue takes contiguous out rows: a row of NaN above and below
        big = torch.full((m + 2, 24), float("nan"), device="cuda")
        out = big[1:m + 1]
        outside = lambda: torch.cat([big[0], big[-1]])
    else:     # a 16-byte offset, m stride 28 + pad: float4-aligned rows (pad % 4 == 0)
        big = torch.full((m, 24 + pad + 4), float("nan"), device="cuda")
        out = big[:, 4:4 + 24]
        outside = lambda: torch.cat([big[:, :4].flatten(), big[:, 28:].flatten()])
    sbig = torch.full((m, 2), float("nan"), device="cuda")
    sq = sbig[:, 1]
    margins = lambda: bool(outside().isnan().all() and sbig[:, 0].isnan().all())
    cfg = None if rows is None else {"small_rows": rows}
    for _ in range(2):
        out.fill_(float("nan"))
        sq.fill_(float("nan"))
        hp.hc_prenorm_gemm(x, fn, out, sq, None, impl="cuda", _config=cfg)
        torch.cuda.synchronize()
        assert hp.api.last_launch[3] == "atomic", hp.api.last_launch
        assert hp.api.last_launch[2] == (rows or (0 if mma else hp.small_rows(m, K, 1, hp.api.sm_count(x.device))))
        _check(x, fn, out, sq, None)
        assert margins(), "wrote outside out / sqrsum"
    replay_on_poisoned(lambda: hp.hc_prenorm_gemm(x, fn, out, sq, None, impl="cuda", _config=cfg),
                       lambda _: (out, sq))
    _check(x, fn, out, sq, None)
    assert margins(), "wrote outside out / sqrsum (graph replay)"
    fo, fq = torch.full_like(out, float("nan")), torch.full_like(sq, float("nan"))
    hp.hc_prenorm_gemm(x, fn, fo, fq, None, impl="cuda", _config={**(cfg or {}), "atomic": False})
    torch.cuda.synchronize()
    assert hp.api.last_launch[3] in ("xchg", "reduce"), hp.api.last_launch
    torch.testing.assert_close(out, fo, rtol=1e-5, atol=1e-5 * float(fo.abs().max()))
    torch.testing.assert_close(sq, fq, rtol=1e-5, atol=0)


@pytest.mark.gpu
def test_gpu_atomic_sum_falls_back_and_refuses_by_name(monkeypatch):
    """Where the atomic sum cannot go (out rows not float4-aligned, several splits, the MMA kernel below 64 rows)
    "auto" takes the fixed-order sums without a word (the same numbers up to rounding) and a forced
    ``_config atomic`` is refused by name; DSV4_HC_PRENORM_ATOMIC=0 and SGLang's deterministic flag switch it off."""
    m, K = 12, 16384
    x, fn = _inputs(m, K, device="cuda", seed=5)
    big = torch.full((m, 26), float("nan"), device="cuda")
    out, sq = big[:, :24], torch.full((m,), float("nan"), device="cuda")   # m stride 26: not float4-aligned
    hp.hc_prenorm_gemm(x, fn, out, sq, None, impl="cuda")
    torch.cuda.synchronize()
    assert hp.api.last_launch[3] == "reduce", hp.api.last_launch
    _check(x, fn, out, sq, None)
    with pytest.raises(UnsupportedCase, match="hc_prenorm: _config atomic "):
        hp.hc_prenorm_gemm(x, fn, out, sq, None, impl="cuda", _config={"atomic": True})
    o, q = _poisoned(m, 24, 4, "cuda")
    with pytest.raises(UnsupportedCase, match="hc_prenorm: _config atomic "):
        hp.hc_prenorm_gemm(x, fn, o, q, 4, impl="cuda", _config={"atomic": True})
    with pytest.raises(UnsupportedCase, match="hc_prenorm: _config atomic "):
        hp.hc_prenorm_gemm(x, fn, *_poisoned(m, 24, 1, "cuda", flat=True), None, impl="cuda",
                           _config={"atomic": True, "xchg": True})
    with pytest.raises(UnsupportedCase, match="hc_prenorm: _config atomic "):   # the MMA kernel at m < 64
        hp.hc_prenorm_gemm(x, fn, *_poisoned(m, 24, 1, "cuda", flat=True), None, impl="cuda",
                           _config={"atomic": True, "small_rows": 0})
    for env, val in (("DSV4_HC_PRENORM_ATOMIC", "0"), ("SGLANG_ENABLE_DETERMINISTIC_INFERENCE", "1")):
        monkeypatch.setenv(env, val)
        o, q = _poisoned(m, 24, 1, "cuda", flat=True)
        hp.hc_prenorm_gemm(x, fn, o, q, None, impl="cuda")
        torch.cuda.synchronize()
        assert hp.api.last_launch[3] == "reduce", (env, hp.api.last_launch)
        _check(x, fn, o, q, None)
        monkeypatch.delenv(env)


# the MMA kernel with 16 / 32 x rows per block (kernel.cuh kR, params mma_rows; "auto" at decode sizes, H100)
@pytest.mark.gpu
@pytest.mark.parametrize("m, K, num_splits, rows, p", [
    (16, 16384, None, 16, None), (17, 16384, None, 16, None), (33, 16384, None, 32, None), (47, 16416, None, 16, 5),
    (63, 16384, None, 16, 64), (64, 16384, None, 32, 2), (100, 16384, None, 16, None), (129, 4096, None, 32, 3),
    (16, 16384, 64, 16, None), (50, 16384, 64, 16, None), (63, 16384, 64, 32, None), (100, 16416, 64, 32, None),
    (40, 16384, 7, 16, None), (40, 16384, 4, 32, 3), (300, 8192, 16, 32, None), (21, 1024, 2, 16, 1),
])
def test_gpu_mma_rows(m, K, num_splits, rows, p):
    """Forced 16 / 32-row tiles against float64 on poisoned outputs: odd m (the last tile shifted back over rows
    of the one before, which it must not store), K % 64 == 32, one split with sub-slices added by atomics and by the
    reduce grid (the same call in fixed order twice: the same bits), the caller's splits without sub-slices and
    with them (reduce grid), every call once more from a CUDA graph onto poisoned outputs."""
    x, fn = _inputs(m, K, device="cuda", seed=m + K + rows)
    S = num_splits or 1
    sums = (True, False) if S == 1 else (False,)
    fixed = None
    for atomic in sums:
        cfg = {"mma_rows": rows, "atomic": atomic, **({} if p is None else {"p": p})}
        out, sq = _poisoned(m, 24, S, "cuda", flat=num_splits is None)
        hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl="cuda", _config=cfg)
        torch.cuda.synchronize()
        P = p or hp.mma_rows_sub_splits(m, K, S, hp.api.sm_count(x.device), rows, not atomic)
        assert hp.api.last_launch == ("cuda", P, 0, None if P == 1 else "atomic" if atomic else "reduce", rows), cfg
        _check(x, fn, out, sq, num_splits)
        if not atomic:   # fixed order: the same bits on every call and replay
            if fixed is None:
                fixed = out.clone(), sq.clone()
            assert torch.equal(out, fixed[0]) and torch.equal(sq, fixed[1]), cfg
        replay_on_poisoned(lambda: hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl="cuda", _config=cfg),
                           lambda _: (out, sq))
        _check(x, fn, out, sq, num_splits)
        if not atomic:
            assert torch.equal(out, fixed[0]) and torch.equal(sq, fixed[1]), cfg


@pytest.mark.gpu
def test_gpu_mma_rows_auto_and_refusals(monkeypatch):
    """What "auto" takes at SGLang's decode shapes (16-row tiles with its 64 splits and with num_splits None, atomic
    and, with the deterministic flag, the reduce grid; the few-rows kernel below m = 16 and where out rows are only
    float4-aligned; the 64-row tile above the rule's m) and the by-name refusals of a forced mma_rows."""
    from torch.profiler import ProfilerActivity, profile
    K, sms = 16384, hp.api.sm_count(torch.device("cuda"))
    x, fn = _inputs(48, K, device="cuda", seed=9)
    cases = [(48, 64, ("cuda", 1, 0, None, 16), "<true, false, 16>"),
             (48, None, ("cuda", hp.mma_rows_sub_splits(48, K, 1, sms, 16, False), 0, "atomic", 16),
              "<true, true, 16>")]
    for m, S, want, kernel in cases:
        out, sq = _poisoned(m, 24, S or 1, "cuda", flat=S is None)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            hp.hc_prenorm_gemm(x[:m], fn, out, sq, S)
            torch.cuda.synchronize()
        assert hp.api.last_launch == want, hp.api.last_launch
        names = {e.name for e in prof.events() if "hc_prenorm_kernel" in e.name}
        assert len(names) == 1 and kernel in names.pop(), names
        _check(x[:m], fn, out, sq, S)
    monkeypatch.setenv("SGLANG_ENABLE_DETERMINISTIC_INFERENCE", "1")
    out, sq = _poisoned(48, 24, 1, "cuda", flat=True)
    hp.hc_prenorm_gemm(x, fn, out, sq, None)
    torch.cuda.synchronize()
    assert hp.api.last_launch == ("cuda", hp.mma_rows_sub_splits(48, K, 1, sms, 16, True), 0, "reduce", 16), hp.api.last_launch
    _check(x, fn, out, sq, None)
    monkeypatch.delenv("SGLANG_ENABLE_DETERMINISTIC_INFERENCE")
    out, sq = _poisoned(12, 24, 64, "cuda")
    hp.hc_prenorm_gemm(x[:12], fn, out, sq, 64)   # below 16 rows: the few-rows kernel
    torch.cuda.synchronize()
    assert hp.api.last_launch[2] > 0 and hp.api.last_launch[4] is None, hp.api.last_launch
    big = torch.full((48, 28), float("nan"), device="cuda")   # float4-aligned rows, m stride 28: few-rows atomics
    hp.hc_prenorm_gemm(x, fn, big[:, :24], sq[0, :1].expand(48).clone(), None)
    torch.cuda.synchronize()
    assert hp.api.last_launch[2] > 0 and hp.api.last_launch[3] == "atomic", hp.api.last_launch
    o, q = _poisoned(48, 24, 64, "cuda")
    bad = [({"mma_rows": 8}, 48, 24, 64), ({"mma_rows": 16, "small_rows": 4}, 48, 24, 64),
           ({"mma_rows": 32, "xchg": True}, 48, 24, None), ({"mma_rows": 32}, 20, 24, 64),
           ({"mma_rows": 16}, 48, 17, 64)]
    for cfg, m, n, S in bad:
        xo, fo = _inputs(m, K, n=n, device="cuda", seed=1)
        o, q = _poisoned(m, n, S or 1, "cuda", flat=S is None)
        with pytest.raises(UnsupportedCase, match="hc_prenorm: _config mma_rows "):
            hp.hc_prenorm_gemm(xo, fo, o, q, S, impl="cuda", _config=cfg)
    o, q = _poisoned(48, 24, 1, "cuda", flat=True)
    with pytest.raises(UnsupportedCase, match="hc_prenorm: _config p "):
        hp.hc_prenorm_gemm(x, fn, o, q, None, impl="cuda", _config={"mma_rows": 16, "p": 65})
    o, q = _poisoned(48, 24, 64, "cuda")   # mma_rows 64: the 64-row MMA kernel (here its general instance, m < 64)
    hp.hc_prenorm_gemm(x, fn, o, q, 64, impl="cuda", _config={"mma_rows": 64})
    torch.cuda.synchronize()
    assert hp.api.last_launch[2] == 0 and hp.api.last_launch[4] == 64, hp.api.last_launch
    _check(x, fn, o, q, 64)
    o, q, _ = _strided_out(64, 48, 4)   # P = 1 needs contiguous out rows
    with pytest.raises(UnsupportedCase, match="hc_prenorm: _config mma_rows "):
        hp.hc_prenorm_gemm(x, fn, o, q, 64, impl="cuda", _config={"mma_rows": 16})
    hp.hc_prenorm_gemm(x, fn, o, q, 64)   # auto: not the 16-row tile there
    torch.cuda.synchronize()
    assert hp.api.last_launch[4] != 16, hp.api.last_launch
    _check(x, fn, o, q, 64)


def _xchg_state(stream=None):
    """(epochs [64], tickets [64]) of the exchange buffer of cuda:0's current (or the given) stream."""
    with torch.cuda.stream(stream or torch.cuda.current_stream()):
        buf = hp.api._XCHG[stream_key(torch.device("cuda", 0))]
    h = buf.view(torch.int32)[:128].cpu().long()
    return h[:64], h[64:]


@pytest.mark.gpu
def test_gpu_exchange_epochs_tickets_and_changing_rows():
    """The exchange (num_splits None: the few-rows kernel's sub-slices summed in its own launch, kernel_small.cuh
    xchg_consume) over calls whose m and rows per block change, on one buffer: every call matches float64 and
    the reduce grid bit for bit (a word left by an earlier call, of other rows per block and other data, never
    passes for this call's), every ticket is 0 after each call, and row r's epoch has advanced by the number of
    calls that covered it."""
    K = 16384
    hp.hc_prenorm_gemm(*_inputs(1, K, device="cuda"), *_poisoned(1, 24, 1, "cuda", flat=True), None, impl="cuda",
                       _config={"xchg": True})
    torch.cuda.synchronize()
    assert hp.api.last_launch[3] == "xchg"
    e0, t0 = _xchg_state()
    assert (t0 == 0).all(), t0
    covered = torch.zeros(64, dtype=torch.long)
    plan = [(1, None), (8, None), (63, None), (2, 16), (17, None), (63, 1), (5, 4), (63, 8), (1, 2), (40, None),
            (9, 16), (9, 16), (3, None)]
    for i, (m, R) in enumerate(plan):
        x, fn = _inputs(m, K, device="cuda", seed=100 + i)
        out, sq = _poisoned(m, 24, 1, "cuda", flat=True)
        cfg = {"xchg": True, **({} if R is None else {"small_rows": R})}
        hp.hc_prenorm_gemm(x, fn, out, sq, None, impl="cuda", _config=cfg)
        torch.cuda.synchronize()
        assert hp.api.last_launch == ("cuda", 64, R or hp.decode_rows(m, K, 1, hp.api.sm_count(x.device)), "xchg", None), (m, R)
        covered[:m] += 1
        _check(x, fn, out, sq, None)
        epochs, tickets = _xchg_state()
        assert (tickets == 0).all(), (m, R, tickets)
        assert torch.equal((epochs - e0) % (1 << 32), covered), (m, R, epochs - e0, covered)
        o2, q2 = _poisoned(m, 24, 1, "cuda", flat=True)
        hp.hc_prenorm_gemm(x, fn, o2, q2, None, impl="cuda",
                           _config={"small_rows": hp.api.last_launch[2], "xchg": False, "atomic": False})
        torch.cuda.synchronize()
        assert torch.equal(o2, out) and torch.equal(q2, sq), (m, R)


@pytest.mark.gpu
def test_gpu_exchange_graph_of_several_calls_and_two_streams():
    """One CUDA graph holding three exchange calls of different m (3, 40, 3: the rows 0-2 are covered by all three,
    one after the other), replayed on poisoned outputs four times: the eager results bit for bit each time,
    tickets back to 0. Then two streams at once, each with its own exchange buffer."""
    K = 16384
    cases = [(3, 31), (40, 32), (3, 33)]
    ins = [_inputs(m, K, device="cuda", seed=sd) for m, sd in cases]
    outs = [_poisoned(m, 24, 1, "cuda", flat=True) for m, _ in cases]

    def calls():
        for (x, fn), (o, q) in zip(ins, outs):
            hp.hc_prenorm_gemm(x, fn, o, q, None, impl="cuda", _config={"xchg": True})
        return [t for pair in outs for t in pair]

    eager = [t.clone() for t in calls()]
    torch.cuda.synchronize()
    for (x, fn), (o, q) in zip(ins, outs):
        _check(x, fn, o, q, None)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        calls()   # warm-up: this stream's exchange buffer
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        calls()
    for _ in range(4):
        for t in outs:
            t[0].fill_(float("nan"))
            t[1].fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip([t for pair in outs for t in pair], eager))
        assert (_xchg_state(s)[1] == 0).all()
    # two streams at once (SGLang's two-batch overlap): each stream's calls use its own buffer
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    o1, o2 = _poisoned(40, 24, 1, "cuda", flat=True), _poisoned(3, 24, 1, "cuda", flat=True)
    s1.wait_stream(torch.cuda.current_stream())
    s2.wait_stream(torch.cuda.current_stream())
    for _ in range(20):
        with torch.cuda.stream(s1):
            hp.hc_prenorm_gemm(*ins[1], *o1, None, impl="cuda", _config={"xchg": True})
        with torch.cuda.stream(s2):
            hp.hc_prenorm_gemm(*ins[2], *o2, None, impl="cuda", _config={"xchg": True})
    torch.cuda.synchronize()
    assert torch.equal(o1[0], eager[2]) and torch.equal(o1[1], eager[3])
    assert torch.equal(o2[0], eager[4]) and torch.equal(o2[1], eager[5])
    assert (_xchg_state(s1)[1] == 0).all() and (_xchg_state(s2)[1] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("m, num_splits", [(1, None), (8, None), (64, None), (64, 16),
                                           (512, None), (8192, None), (8192, 4)])
def test_gpu_shared_memory_within_sm120_limit(m, num_splits):
    smem = hp.compiled_smem(m=m, num_splits=num_splits)
    assert smem <= hp.SMEM_LIMIT, f"{smem} B > {hp.SMEM_LIMIT} B"
