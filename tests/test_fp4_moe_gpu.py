"""fp4_moe on a GPU (skipped without one, with the reason): every impl at DeepSeek-V4's shapes against the float64
reference, scale forms, CUDA-graph capture, the compiled decode kernels' routing, scale range and layouts, the
streaming kernels' cases, warps per item, skew and refusals, and the random-call fuzz. Tolerance: test_fp4_moe.py."""
import pytest
import torch

from deepseek_v4_kernel.errors import UnsupportedCase

from fp4_moe_cases import (STREAM_CASES, _default_impl_spec, capture_and_replay_new_routing, _gpu_weights, _need_cuda_decode, _rand_weights,
                           make_routing, make_weights, run_and_check)
from fuzz import SEEDS, SM_COUNTS, named, patch_sm_count, replay_on_poisoned

from deepseek_v4_kernel.ops import fp4_moe as op


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
    capture_and_replay_new_routing(x, w, tw, ids, out, E, k, **kw)
    assert op.LAST_KERNELS["config"][2] == want, "the captured call took another impl than the eager one"


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



@pytest.mark.gpu
@pytest.mark.parametrize("variant", sorted(op.dispatch.STREAM_VARIANTS))
@pytest.mark.parametrize("case", STREAM_CASES, ids=lambda c: f"M{c[0]}I{c[1]}k{c[2]}E{c[3]}")
def test_cuda_stream(case, variant):
    """Every variant of the streaming kernels on the stream cases (every size class, odd M, TP shards, drops, skew,
    2048 slots) against the float64 reference; bit-identical on a second run."""
    _need_cuda_decode()
    M, I, k, E, drop, skew, lim, rsf, f32 = case
    H = 4096
    w13, s13, w2, s2 = _rand_weights(E, H, I)
    if f32:
        s13, s2 = torch.exp2(s13.float() - 127), torch.exp2(s2.float() - 127)
    tw, ids = make_routing(M, E, k, "cuda", seed=M + I + variant, drop=drop, skew=skew)
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
