"""fp4_moe's routing ids, for any value: the documented contract (ops/fp4_moe/api.py) is that an id < 0 or >= E drops
that slot (expert parallelism: an expert of another rank) and nothing outside the tensors is read. Checked against
the float64 reference, which drops the same slots, on every path: the Triton kernels (interpreter on the CPU; every
impl on a GPU) and the compiled decode kernels (GPU)."""
import pytest
import torch

from conftest import HAS_CUDA
from deepseek_v4_kernel.ops import fp4_moe as moe
from deepseek_v4_kernel.reference.fp4_moe import fp4_moe_reference, quantize_mxfp4

I32_MAX, I32_MIN = 2 ** 31 - 1, -(2 ** 31)


def _case(E, H, inter, M, k, dtype, device, seed=0, act_quant=None):
    g = torch.Generator().manual_seed(seed)
    w13, s13 = quantize_mxfp4(torch.randn(E, 2 * inter, H, generator=g) * 0.1, scale_dtype=torch.float32)
    w2, s2 = quantize_mxfp4(torch.randn(E, H, inter, generator=g) * 0.1, scale_dtype=torch.float32)
    x = torch.randn(M, H, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, E, (M, k), generator=g, dtype=torch.int64)
    bad = [-1, -5, E, E + 7, I32_MAX, I32_MIN]
    if dtype == torch.int64:
        bad += [2 ** 32 + 1, -(2 ** 32), 2 ** 40 + E - 1]   # would alias a valid expert if truncated to 32 bits
    flat = ids.view(-1)
    flat[torch.randperm(flat.numel(), generator=g)[:len(bad)]] = torch.tensor(bad)
    ids[M - 1] = -1                                          # a token with every slot dropped: out row 0
    tw = torch.rand(M, k, generator=g)
    ref = fp4_moe_reference(x, w13, s13, w2, s2, tw, ids, swiglu_limit=7.0, routed_scaling_factor=1.5,
                            act_quant=act_quant)
    args = [t.to(device) for t in (x, w13.view(torch.int8), s13, w2.view(torch.int8), s2, tw, ids.to(dtype))]
    return args, ref


def _run(args, ref, impl=None):
    out = torch.full_like(args[0], float("nan"))
    moe.fp4_moe(*args, swiglu_limit=7.0, routed_scaling_factor=1.5, impl=impl, out=out)
    if out.is_cuda:
        torch.cuda.synchronize()
    out = out.double().cpu()
    assert torch.isfinite(out).all(), "an unwritten or poisoned output row"
    assert torch.equal(out[-1], torch.zeros_like(out[-1])), "a token with every slot dropped must give 0"
    rel = ((out - ref).norm() / ref.norm()).item()
    assert rel < 2e-2, rel   # bf16 h, y and output (tests/fp4_moe_cases.py's bound)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("M", [3, 90])   # the one-program routing (<= 512 slots), and the multi-program one
def test_invalid_ids_drop_their_slot_interpreter(dtype, M):
    if HAS_CUDA:
        pytest.skip("the GPU runs test_invalid_ids_drop_their_slot_gpu")
    args, ref = _case(8, 64, 32, M, 6, dtype, "cpu", seed=M)
    _run(args, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("impl", [None, "cuda_decode", "dequant", "dot_scaled", "mxfp8"])
@pytest.mark.parametrize("M", [9, 100])
def test_invalid_ids_drop_their_slot_gpu(dtype, impl, M):
    """Every impl on the GPU, at a decode (9 tokens) and a prefill size (100 tokens: 600 slots, the multi-program
    routing), 256 experts of hidden 512 / I 256 (the compiled decode kernels take up to 256 slots)."""
    if impl == "cuda_decode" and M * 6 > 256:
        pytest.skip("cuda_decode takes up to 256 slots")
    args, ref = _case(256, 512, 256, M, 6, dtype, "cuda", seed=M, act_quant="mxfp8" if impl == "mxfp8" else None)
    _run(args, ref, impl)
