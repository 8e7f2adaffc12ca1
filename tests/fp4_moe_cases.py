"""Shared pieces of the fp4_moe tests (test_fp4_moe*.py, test_multi_gpu.py): weights and routing in the op's layout,
the float64 bound every impl is held to, the check-and-run helper, the GPU weight caches, the streaming kernels' cases
and the test's own statement of the default dispatch rule. The tolerance argument: test_fp4_moe.py's docstring."""
import os

import pytest
import torch

from deepseek_v4_kernel.reference.fp4_moe import dequantize_mxfp4, fp4_moe_reference, quantize_act_mxfp8, quantize_mxfp4

from deepseek_v4_kernel.ops import fp4_moe as op


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


def capture_and_replay_new_routing(x, w, tw, ids, out, E, k, **kw):
    """Capture one fp4_moe call (``kw``, writing ``out``) in a CUDA graph on a side stream, then replay it twice with
    new routing (drops, skew) and activations copied into the same buffers, ``out`` poisoned with NaN each time, and
    hold every element to the float64 bound (swiglu_limit 10, rsf 1.5 as ``kw`` passes them)."""
    M, H = x.shape
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            op.fp4_moe(x, *w, tw, ids, **kw)
    torch.cuda.current_stream().wait_stream(s)
    for seed in (2, 3):
        tw2, ids2 = make_routing(M, E, k, "cuda", seed=seed, drop=0.2, skew=seed == 3)
        ids.copy_(ids2), tw.copy_(tw2), x.copy_(torch.randn(M, H, device="cuda").bfloat16())
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = fp4_moe_reference(x, *w, tw, ids, swiglu_limit=10.0, routed_scaling_factor=1.5)
        A = bound(x, *w, tw, ids, 10.0, 1.5)
        assert not torch.isnan(out).any()
        assert ((out.double() - ref).abs() <= 2.0 ** -7 * A + 1e-30).all()
