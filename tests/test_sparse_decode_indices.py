"""Sparse decode for any index value (GPU): the documented semantics (docs/sparse_decode.md section 1) are that a slot
whose index is -1, < -1 or >= num_pages * page_size, or whose position is past topk_length, is skipped and never read;
a row with no valid slot gives out 0 and lse +inf. Checked on every kernel against the float64 reference, with the
extreme values an index can hold (INT32_MIN, INT32_MAX, one past the cache), lengths past topk and negative, and
poisoned outputs; and at the new checkpoints' shapes (DSpark verify s_q 8, window 128 + 1152 compressed positions)."""
import pytest
import torch

from deepseek_v4_kernel.ops import sparse_decode as sd
from test_sparse_decode import TC_KERNELS, _case, _check, _run_poisoned, _to_cuda

I32_MAX, I32_MIN = 2 ** 31 - 1, -(2 ** 31)


def _invalid_case(b, s_q, h_q, topk, extra_topk, seed):
    a = _case(b=b, s_q=s_q, h_q=h_q, topk=topk, extra_topk=extra_topk, with_len=True, with_extra_len=True, sink=True,
              seed=seed, page_size=64, n_main=300, n_extra=700)
    g = torch.Generator().manual_seed(seed)
    for key, cache in (("indices", "k_cache"), ("extra_indices", "extra_k_cache")):
        n = a[cache].shape[0] * a[cache].shape[1]        # num_pages * page_size: the first invalid index
        idx = a[key].view(-1)
        bad = torch.tensor([-2, -7, I32_MIN, n, n + 1, n + 4096, I32_MAX], dtype=torch.int32)
        where = torch.randperm(idx.numel(), generator=g)[: 4 * len(bad)]
        idx[where] = bad.repeat(4)
    a["topk_length"][0] = topk + 1000                    # past the list: clipped to topk
    a["extra_topk_length"][0] = I32_MAX
    if b > 1:
        a["topk_length"][1] = -5                         # negative: no main slot
        a["extra_topk_length"][1] = I32_MIN
    if b > 2:
        a["indices"][2] = I32_MAX                        # a row whose every slot is invalid: out 0, lse +inf
        a["extra_indices"][2] = -3
    return a


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["auto", "simt"] + TC_KERNELS)
@pytest.mark.parametrize("b,s_q,h_q", [(3, 1, 64), (5, 2, 16), (3, 8, 32)])
def test_gpu_invalid_indices_are_skipped_on_every_kernel(impl, b, s_q, h_q):
    a = _to_cuda(_invalid_case(b, s_q, h_q, topk=96, extra_topk=200, seed=b * 10 + s_q))
    out, lse = _run_poisoned(a, impl=None if impl == "auto" else impl)
    torch.cuda.synchronize()
    _check(a, out, lse)
    if b > 2:
        assert torch.equal(out[2].float().cpu(), torch.zeros_like(out[2].float().cpu()))
        assert torch.isposinf(lse[2].cpu()).all()


@pytest.mark.gpu
@pytest.mark.parametrize("b,s_q,h_q", [(1, 8, 64), (8, 8, 64), (64, 1, 64), (4, 8, 16), (32, 1, 8)])
def test_gpu_new_checkpoint_shapes(b, s_q, h_q):
    """DSpark verify (8 tokens per request, as s_q 8 or as rows) over the 128-token window (indices) and V4.1's 1152
    compressed positions (extra), TP 1 to 8 heads, a few invalid slots, lengths as SGLang passes them."""
    a = _to_cuda(_case(b=b, s_q=s_q, h_q=h_q, topk=128, extra_topk=1152, n_main=1024, n_extra=8192, with_len=True,
                       with_extra_len=True, sink=True, seed=b + s_q + h_q))
    out, lse = _run_poisoned(a)
    torch.cuda.synchronize()
    _check(a, out, lse)
    launch = sd.launch_plan(b, s_q, h_q, 128 + 1152, sd._sm_count(a["q"].device))
    assert 1 <= launch[2] <= sd.MAX_SPLITS
