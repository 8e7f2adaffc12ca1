"""GPU tests of the streaming decode kernels' variants 2-5 (csrc/fp4_moe/kernel_stream.cuh + kernel_stream_src.cuh:
the cp.async shared-memory weight ring, two MMA chains per tile) and the bench-only diagnostics; every variant's run of
the stream cases is test_fp4_moe_gpu.py's test_cuda_stream (with the routing / scale / graph tests of variants 0 / 1).
Here, against the float64 reference (deepseek_v4_kernel/reference/fp4_moe.py, bound 2^-7 A as
fp4_moe_cases.run_and_check) on fresh random inputs, outputs poisoned with NaN first: all tokens on one expert, -1 and
out-of-range ids, uint8 and float32 scales (bit-identical), graph capture with new routing per replay; the diagnostics run (finite, every element written, graph-safe) and are refused where they do not
exist. CPU: the plan's checks only."""
import pytest
import torch

from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.ops import fp4_moe as op
from fp4_moe_cases import _need_cuda_decode, _rand_weights, capture_and_replay_new_routing, make_routing, run_and_check

NEW_VARIANTS = (2, 3, 4, 5)


def test_stream_plan_variants_and_diags():
    plan = op.dispatch.stream_plan
    assert set(op.dispatch.STREAM_VARIANTS) == {0, 1, 2, 3, 4, 5}
    assert op.dispatch.STREAM_DEFAULT_VARIANT is None or op.dispatch.STREAM_DEFAULT_VARIANT in op.dispatch.STREAM_VARIANTS
    for v, (st, bps, src, acc) in op.dispatch.STREAM_VARIANTS.items():
        assert plan(8, 6, 256, 4096, 2048, 132, {"variant": v})["variant"] == v and src in ("regs", "smem")
    assert plan(8, 6, 256, 4096, 2048, 132, {"variant": 3, "diag": "loads"})["diag"] == "loads"
    assert "diag" not in plan(8, 6, 256, 4096, 2048, 132)
    for bad in ({"variant": 2, "diag": "loads"}, {"variant": 3, "diag": "compute"}, {"diag": "both"}):
        with pytest.raises(ValueError, match="stream diag must be one of"):
            plan(8, 6, 256, 4096, 2048, 132, bad)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", NEW_VARIANTS)
@pytest.mark.parametrize("M", [9, 255])
def test_stream_variant_one_expert_and_bad_ids(M, variant):
    """Every token on expert 3 (ceil(M / 8) passes of it), a slot -1, ids E + 7 and a huge int64 id; 1 and 4 warps
    per item."""
    _need_cuda_decode()
    E, H, I, k = 32, 4096, 512, 4
    w = _rand_weights(E, H, I)
    tw, ids = make_routing(M, E, k, "cuda", seed=M)
    ids = ids.long()
    ids[:, 0] = 3
    ids[:, 1:] = torch.where(ids[:, 1:] == 3, (ids[:, 1:] + 1) % E, ids[:, 1:])
    ids[1, 0] = -1
    ids[2, 2] = E + 7
    ids[4, 1] = 2 ** 40 + 1
    x = torch.randn(M, H, device="cuda").bfloat16() * 0.5
    for wpi in (1, 4):
        run_and_check(x, w, tw, ids, impl="cuda_stream", swiglu_limit=10.0, rsf=1.5,
                      config={"stream": {"variant": variant, "wpi1": wpi, "wpi2": wpi}})


@pytest.mark.gpu
@pytest.mark.parametrize("variant", NEW_VARIANTS)
@pytest.mark.parametrize("lo,hi", [(118, 126), (124, 136)], ids=["scales<=2", "scales>2"])
def test_stream_variant_scale_forms(lo, hi, variant):
    """Scale exponents above 128 (the second multiply); uint8, float8_e8m0fnu and float32 scales bit-identical;
    x / out rows with a stride > hidden; a token with every slot dropped; no swiglu, no rsf."""
    _need_cuda_decode()
    E, H, I, M, k = 8, 4096, 1024, 5, 4
    g = torch.Generator(device="cuda").manual_seed(lo + variant)
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), device="cuda", generator=g, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (E, H, I // 2), device="cuda", generator=g, dtype=torch.uint8)
    s13 = torch.randint(lo, hi, (E, 2 * I, H // 32), device="cuda", generator=g, dtype=torch.uint8)
    s2 = torch.randint(lo, hi, (E, H, I // 32), device="cuda", generator=g, dtype=torch.uint8)
    tw, ids = make_routing(M, E, k, "cuda", seed=lo)
    ids[3] = -1
    xs = torch.randn(M, H + 64, device="cuda").bfloat16() * (2.0 ** (120 - hi))
    x = xs[:, 8:H + 8]
    cfg = {"stream": {"variant": variant}}
    res = run_and_check(x, (w13, s13, w2, s2), tw, ids, impl="cuda_stream", rsf=None, config=cfg)
    f13, f2 = torch.exp2(s13.float() - 127), torch.exp2(s2.float() - 127)
    out = torch.full((M, H + 32), float("nan"), dtype=torch.bfloat16, device="cuda")[:, :H]
    b = op.fp4_moe(x, w13.view(torch.int8), f13, w2.view(torch.int8), f2, tw, ids, impl="cuda_stream", out=out,
                   config=cfg)
    assert torch.equal(res, b)
    if hasattr(torch, "float8_e8m0fnu"):
        c = op.fp4_moe(x, w13, s13.view(torch.float8_e8m0fnu), w2, s2.view(torch.float8_e8m0fnu), tw, ids,
                       impl="cuda_stream", config=cfg)
        assert torch.equal(res, c)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", NEW_VARIANTS)
def test_stream_variant_graph_capture(variant):
    """Captured once, replayed with new routing (drops, skew) and activations in the same buffers."""
    _need_cuda_decode()
    E, H, I, M, k = 16, 4096, 1024, 8, 6
    w = _rand_weights(E, H, I)
    x = torch.randn(M, H, device="cuda").bfloat16()
    tw, ids = make_routing(M, E, k, "cuda", seed=1)
    out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")
    kw = dict(swiglu_limit=10.0, routed_scaling_factor=1.5, out=out, impl="cuda_stream",
              config={"stream": {"variant": variant}})
    op.fp4_moe(x, *w, tw, ids, **kw)
    torch.cuda.synchronize()
    capture_and_replay_new_routing(x, w, tw, ids, out, E, k, **kw)


@pytest.mark.gpu
def test_stream_smem_ring_refuses_misaligned_scale_rows():
    """The shared-memory rings copy 4-byte scale words: uint8 scale rows not 4-byte aligned are refused by name
    (the register-ring variants take them)."""
    _need_cuda_decode()
    E, H, I, M, k = 4, 256, 128, 3, 2
    w13, s13, w2, s2 = _rand_weights(E, H, I)
    big = torch.randint(118, 125, (E, 2 * I, H // 32 + 1), device="cuda", dtype=torch.uint8)
    s13_odd = big[:, :, 1:]   # row stride 9 bytes, offset 1
    tw, ids = make_routing(M, E, k, "cuda")
    x = torch.randn(M, H, device="cuda").bfloat16()
    with pytest.raises(UnsupportedCase, match=r"stream variant 3 \(shared-memory ring\) needs w13_scale rows 4-byte"):
        op.fp4_moe(x, w13, s13_odd, w2, s2, tw, ids, impl="cuda_stream", config={"stream": {"variant": 3}})
    s13_odd.copy_(s13)
    run_and_check(x, (w13, s13_odd, w2, s2), tw, ids, impl="cuda_stream", config={"stream": {"variant": 1}})


DIAGS = [(d, v) for d, (_, vs) in op.dispatch.STREAM_DIAGS.items() for v in vs]


@pytest.mark.gpu
@pytest.mark.parametrize("diag,variant", DIAGS, ids=[f"{d}-v{v}" for d, v in DIAGS])
def test_stream_diagnostics_run(diag, variant):
    """The bench-only diagnostics (wrong results by design): they run at 1, 8 and 255 tokens (E 256, I 2048), write
    every output element with a finite value, replay in a graph, and refuse float32 scales by name."""
    _need_cuda_decode()
    E, H, I, k = 256, 4096, 2048, 6
    w = _rand_weights(E, H, I)
    cfg = {"stream": {"variant": variant, "diag": diag}}
    for M in (1, 8, 255):
        tw, ids = make_routing(M, E, k, "cuda", seed=M)
        x = torch.randn(M, H, device="cuda").bfloat16() * 0.5
        out = torch.full((M, H), float("nan"), dtype=torch.bfloat16, device="cuda")
        op.fp4_moe(x, *w, tw, ids, swiglu_limit=10.0, routed_scaling_factor=1.5, impl="cuda_stream", out=out,
                   config=cfg)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), "a diagnostic left an output element unwritten"
        assert op.LAST_KERNELS["stream"]["diag"] == diag
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            op.fp4_moe(x, *w, tw, ids, impl="cuda_stream", out=out, config=cfg)
    torch.cuda.current_stream().wait_stream(s)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    f13 = torch.exp2(w[1].float() - 127)
    with pytest.raises(UnsupportedCase, match=f"stream diag '{diag}' exists for uint8"):
        op.fp4_moe(x, w[0], f13, w[2], w[3], tw, ids, impl="cuda_stream", config=cfg)
