"""The checkpoints users point at this patch with SGLang 0.5.21+, at the shapes SGLang 0.5.23 gives our ops:

* DeepSeek-V4-Flash-0731: a DSpark draft head, whose verify step scores up to 8 tokens per request. SGLang calls the
  indexer with one row per token (q_indexer.unsqueeze(1): next_n = 1, srt/layers/attention/dsv4/indexer.py) and
  the SM120 sparse decode with the verify tokens as rows; the direct API takes next_n / s_q up to 8 as well.
* DeepSeek-V4.1-Flash: index top-k 1152 (SGLang's DeepSeekV4Config default is 512): the sparse decode's extra list
  (the compressed positions SGLang passes as extra_indices_in_kvcache, beside the 128-token window as indices).
  Its 32x32 FP8 blocks are the FP8 linears' (not these ops).

Shapes come from SGLang 0.5.23's own config (srt/configs/deepseek_v4.py, read as text). Each op takes them: the
launch rules and checks on the CPU (the compiled sparse decode runs on a GPU: tools/gpu_robust.sh), the Triton kernels
under the interpreter at these head counts / top-k / rows with short contexts, against the float64 references."""
import os
import re

import pytest
import torch

from deepseek_v4_kernel.ops import fp4_moe as moe
from deepseek_v4_kernel.ops import hc_prenorm as hp
from deepseek_v4_kernel.ops import indexer_logits as il
from deepseek_v4_kernel.ops import sparse_decode as sd
from deepseek_v4_kernel.patch import adapters as ad
from deepseek_v4_kernel.reference import indexer_logits as iref
from deepseek_v4_kernel.reference.fp4_moe import fp4_moe_reference, quantize_mxfp4
from deepseek_v4_kernel.reference.hc_prenorm import hc_prenorm_gemm_ref
from deepseek_v4_kernel.reference.sparse_decode import pack_fp8_ds_mla, sparse_decode_ref

DSPARK_VERIFY_TOKENS = 8      # DeepSeek-V4-Flash-0731: tokens per request in a DSpark verify step
V41_INDEX_TOPK = 1152         # DeepSeek-V4.1-Flash


# DeepSeek-V4's shapes as SGLang 0.5.23's DeepSeekV4Config gives them (field defaults; checked against its source
# below where the wheels are unpacked, so that these tests also run where they are not, e.g. on the GPU machine)
V4 = dict(index_topk=512, window_size=128, index_n_heads=64, index_head_dim=128, hidden_size=4096, hc_mult=4,
          n_routed_experts=256, num_experts_per_tok=6, moe_intermediate_size=2048)


def cfg(name):
    return V4[name]


def test_config_fields_are_where_we_read_them():
    from sglang_env import sglang_dir

    src = open(os.path.join(sglang_dir("0.5.23"), "sglang", "srt", "configs", "deepseek_v4.py")).read()
    fields = {k: int(v) for k, v in re.findall(r"^    (\w+): int = (\d+)$", src, re.M)}
    assert {k: fields.get(k) for k in V4} == V4


# --------------------------------------------------------------------------- sparse decode
@pytest.mark.parametrize("h_q", [64, 32, 16, 8])          # TP 1 / 2 / 4 / 8 of 64 heads
@pytest.mark.parametrize("requests", [1, 8, 64, 256])
def test_sparse_decode_launch_at_the_new_shapes(h_q, requests):
    """Verify rows (8 per request, as rows or as s_q = 8) over window 128 + 1152 compressed positions: every launch
    rule takes them, within the split limit and the workspace the op plans for."""
    total = cfg("window_size") + V41_INDEX_TOPK
    for b, s_q in ((requests * DSPARK_VERIFY_TOKENS, 1), (requests, DSPARK_VERIFY_TOKENS)):
        for sms in (132, 170, 188):
            parts = sd.batch_parts(b, s_q, h_q, total, sms)
            bounds = (0,) + parts + (b,)
            for b0, b1 in zip(bounds, bounds[1:]):
                kernel, hpb, splits, split_tokens = sd.launch_plan(b1 - b0, s_q, h_q, total, sms)
                assert kernel in sd.IMPL_CODE and 1 <= splits <= sd.MAX_SPLITS, (b, s_q, kernel, splits)
                assert split_tokens % sd.TOK_TILE == 0 and splits * split_tokens >= total


def test_sparse_decode_reference_at_the_new_shapes():
    """The float64 reference the GPU test compares with takes s_q 8 and 128 + 1152 positions (invalid slots too)."""
    g = torch.Generator().manual_seed(0)
    main = pack_fp8_ds_mla(torch.randn(256, 512, generator=g), 64)
    extra = pack_fp8_ds_mla(torch.randn(2048, 512, generator=g), 64)
    b, s_q, h_q = 2, DSPARK_VERIFY_TOKENS, 16
    idx = torch.randint(-1, 256, (b, s_q, cfg("window_size")), generator=g, dtype=torch.int32)
    eidx = torch.randint(-1, 2048, (b, s_q, V41_INDEX_TOPK), generator=g, dtype=torch.int32)
    q = torch.randn(b, s_q, h_q, 512, generator=g).bfloat16()
    out, lse = sparse_decode_ref(q, main, idx, extra_k_cache=extra, extra_indices=eidx,
                                 extra_topk_length=torch.tensor([V41_INDEX_TOPK, 700], dtype=torch.int32))
    assert out.shape == (b, s_q, h_q, 512) and torch.isfinite(out).all() and torch.isfinite(lse).all()


# --------------------------------------------------------------------------- indexer
def test_indexer_sglang_call_at_dspark_verify_rows(device):
    """SGLang's call: one row per verify token (next_n = 1, [rows, 1] lengths, a page-table row per token), 64 heads,
    through the adapter that replaces fp8_paged_mqa_logits_torch_sm120."""
    requests, H = 3, cfg("index_n_heads")
    rows = requests * DSPARK_VERIFY_TOKENS
    g = torch.Generator().manual_seed(1)
    cache = iref.pack_paged_k_cache(torch.randn(12, 64, cfg("index_head_dim"), generator=g))
    base = torch.tensor([130, 7, 200])
    lens = (base.repeat_interleave(DSPARK_VERIFY_TOKENS) + torch.arange(rows) % DSPARK_VERIFY_TOKENS).int()
    table = torch.stack([torch.randperm(12, generator=g)[:4] for _ in range(requests)]).int()
    table = table.repeat_interleave(DSPARK_VERIFY_TOKENS, 0)
    q = (torch.randn(rows, 1, H, 128, generator=g) * 1.5).to(torch.float8_e4m3fn)
    w = torch.randn(rows, H, generator=g) * 0.2
    args = [t.to(device) for t in (q, cache, w, lens[:, None], table)]
    out = ad.fp8_paged_mqa_logits_torch_sm120(*args, None, 256, False)
    r = iref.paged_mqa_logits_ref(q, cache, w, lens, table, 256)
    fin = torch.isfinite(r)
    assert torch.equal(torch.isneginf(out.cpu()), ~fin)
    assert ((out.cpu().double()[fin] - r[fin]).abs() <= 1e-3 * r[fin].abs().max()).all()


def test_indexer_direct_api_takes_next_n_8_at_64_heads(device):
    """next_n 8 at 64 heads (before: next_n 1..4 only): rows of next_n = 1 with the 1-D lengths' causal offsets."""
    g = torch.Generator().manual_seed(2)
    B, N, H = 2, DSPARK_VERIFY_TOKENS, 64
    cache = iref.pack_paged_k_cache(torch.randn(6, 64, 128, generator=g))
    q = (torch.randn(B, N, H, 128, generator=g) * 1.5).to(torch.float8_e4m3fn)
    w = torch.randn(B * N, H, generator=g) * 0.2
    lens = torch.tensor([150, 70], dtype=torch.int32)
    table = torch.tensor([[0, 3, 5], [1, 2, -1]], dtype=torch.int32)
    args = [t.to(device) for t in (q, cache, w, lens, table)]
    out = il.fp8_paged_mqa_logits(*args, None, 192, clean_logits=True)
    r = iref.paged_mqa_logits_ref(q, cache, w, lens, table, 192)
    fin = torch.isfinite(r)
    assert torch.equal(torch.isneginf(out.cpu()), ~fin)
    assert ((out.cpu().double()[fin] - r[fin]).abs() <= 1e-3 * r[fin].abs().max()).all()


# --------------------------------------------------------------------------- hc_prenorm
@pytest.mark.parametrize("requests", [1, 4, 32, 128])
def test_hc_prenorm_dispatch_at_verify_rows(requests):
    """m = 8 rows per request (K = hc_mult * hidden = 16384, n = hc_mult * (2 + hc_mult) = 24): a kernel and a Triton
    tile for every row count, with SGLang's splits and without."""
    K, n = cfg("hc_mult") * cfg("hidden_size"), cfg("hc_mult") * (2 + cfg("hc_mult"))
    m = requests * DSPARK_VERIFY_TOKENS
    x, fn = torch.empty(m, K, dtype=torch.bfloat16), torch.empty(n, K)
    for S in (1, 64 if m <= 64 else 16):
        assert hp.pick_impl(x, fn, S) in ("triton", "cuda")
        assert hp.choose_config(m, K, S, 132) is not None


def test_hc_prenorm_runs_at_one_verify_step(device):
    """(the Triton interpreter on the CPU)"""
    K, n, m = cfg("hc_mult") * cfg("hidden_size"), 24, DSPARK_VERIFY_TOKENS
    x = torch.randn(m, K).to(torch.bfloat16)
    fn = torch.randn(n, K) * K ** -0.5
    out, sq = torch.full((m, n), float("nan"), device=device), torch.full((m,), float("nan"), device=device)
    hp.hc_prenorm_gemm(x.to(device), fn.to(device), out, sq)
    ro, rs = hc_prenorm_gemm_ref(x, fn, None)
    out, sq = out.cpu().double(), sq.cpu().double()
    assert (out - ro).norm() / ro.norm() < 2e-3 and (sq - rs).norm() / rs.norm() < 1e-5


# --------------------------------------------------------------------------- MoE
@pytest.mark.parametrize("requests", [1, 8, 64])
def test_fp4_moe_dispatch_at_verify_tokens(requests):
    """M = 8 tokens per request, top-6 of 256 experts, hidden 4096, I 2048: an impl and tiles for every M."""
    M, k, E = requests * DSPARK_VERIFY_TOKENS, cfg("num_experts_per_tok"), cfg("n_routed_experts")
    H, inter = cfg("hidden_size"), cfg("moe_intermediate_size")
    regime = moe.dispatch.regime(M, k, E)
    impl = moe.dispatch.default_impl(regime, torch.device("cpu"))
    c1, c2 = moe.dispatch._pick_config(M, k, E, inter, H, impl)
    assert impl in moe.IMPLS and c1["BM"] == c2.get("BM", c1["BM"])


def test_fp4_moe_runs_at_one_verify_step(device):
    """8 verify tokens x top-6 of 256 experts (hidden / I scaled down for the interpreter), an id of another EP rank."""
    g = torch.Generator().manual_seed(3)
    E, H, inter, M, k = cfg("n_routed_experts"), 128, 64, DSPARK_VERIFY_TOKENS, cfg("num_experts_per_tok")
    w13, s13 = quantize_mxfp4(torch.randn(E, 2 * inter, H, generator=g) * 0.1, scale_dtype=torch.float32)
    w2, s2 = quantize_mxfp4(torch.randn(E, H, inter, generator=g) * 0.1, scale_dtype=torch.float32)
    x = torch.randn(M, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).int()
    ids[0, 0] = -1
    tw = torch.rand(M, k, generator=g)
    args = [t.to(device) for t in (x, w13.view(torch.int8), s13, w2.view(torch.int8), s2, tw, ids)]
    out = moe.fp4_moe(*args, swiglu_limit=10.0, routed_scaling_factor=1.5).cpu()
    ref = fp4_moe_reference(x, w13, s13, w2, s2, tw, ids, swiglu_limit=10.0, routed_scaling_factor=1.5)
    assert (out.double() - ref).norm() / ref.norm() < 2e-2
