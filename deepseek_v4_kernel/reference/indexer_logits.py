"""Float64 references for the lightning-indexer logits, plus a packer for the paged fp8 index cache.

Written from the spec (docs/indexer_logits.md, DeepGEMM tests/test_attention.py), not from a kernel:

    logits[row, t] = scale[t] * sum_h w[row, h] * relu(q[row, h, :] . k[t, :])

where k[t] are the fp8 values and scale[t] the fp32 per-token scale of the cache.
"""
from __future__ import annotations

from typing import Tuple

import torch

BLOCK_KV = 64
HEAD_DIM = 128
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantize_k(k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token fp8 quantization: k [..., 128] float -> (fp8 [..., 128], fp32 scale [...])."""
    amax = k.abs().float().amax(dim=-1).clamp(min=1e-4)
    scale = (amax / FP8_MAX).to(torch.float32)
    vals = (k.float() / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return vals, scale


def pack_paged_k_cache(k: torch.Tensor) -> torch.Tensor:
    """k float [num_blocks, 64, 128] -> cache uint8 [num_blocks, 64, 1, 132]:
    per block 64x128 fp8 values (8192 B), then 64 fp32 scales (256 B)."""
    nb, bs, d = k.shape
    assert bs == BLOCK_KV and d == HEAD_DIM
    vals, scale = quantize_k(k)
    cache = torch.empty((nb, bs * (d + 4)), dtype=torch.uint8, device=k.device)
    cache[:, : bs * d] = vals.reshape(nb, bs * d).view(torch.uint8)
    cache[:, bs * d:] = scale.reshape(nb, bs).contiguous().view(torch.uint8).reshape(nb, bs * 4)
    return cache.view(nb, bs, 1, d + 4)


def unpack_paged_k_cache(cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """cache [num_blocks, 64, 1, 132] bytes -> (values float64 [nb, 64, 128], scales float64 [nb, 64])."""
    nb = cache.shape[0]
    flat = cache.reshape(nb, BLOCK_KV * (HEAD_DIM + 4)).view(torch.uint8)   # nb may be 0 (an empty cache)
    vals = flat[:, : BLOCK_KV * HEAD_DIM].contiguous().view(FP8).double().view(nb, BLOCK_KV, HEAD_DIM)
    scales = flat[:, BLOCK_KV * HEAD_DIM:].contiguous().view(torch.float32).double().view(nb, BLOCK_KV)
    return vals, scales


def row_lengths(context_lens: torch.Tensor, batch: int, next_n: int) -> torch.Tensor:
    """Per-row visible length, int64 [batch * next_n].
    1-D lens: row (i, j) sees len[i] - next_n + 1 + j (causal within the draft; DeepGEMM's test).
    2-D lens [b, next_n]: row (i, j) sees len[i, j]."""
    cl = context_lens.long().cpu()
    if cl.dim() == 1:
        j = torch.arange(next_n)
        lens = cl[:, None] - next_n + 1 + j[None, :]
    else:
        assert cl.shape == (batch, next_n)
        lens = cl
    return lens.clamp(min=0).reshape(-1)


def _paged_rows(q, kv_cache, weights, context_lens, block_table, max_context_len, magnitude):
    """Row by row over each row's visible tokens. magnitude=False: the logits (-inf past the length);
    True: the bound scale[t] * sum_h |w| * sum_d |q k| (0 past the length)."""
    B, N, H, D = q.shape
    vals, scales = unpack_paged_k_cache(kv_cache.cpu())
    qd = q.cpu().double()
    w = weights.cpu().double().reshape(B * N, H)
    if magnitude:
        qd, w, vals, scales = qd.abs(), w.abs(), vals.abs(), scales.abs()
    lens = row_lengths(context_lens, B, N)
    bt = block_table.cpu().long()
    fill = 0.0 if magnitude else float("-inf")
    out = torch.full((B * N, max_context_len), fill, dtype=torch.float64)
    for i in range(B):
        for j in range(N):
            r = i * N + j
            L = int(min(lens[r], max_context_len))
            if L <= 0:
                continue
            # tokens whose block-table column is past the table or whose page is not in the cache are skipped
            t = torch.arange(L)
            t = t[t // BLOCK_KV < bt.shape[1]]
            pages = bt[i, t // BLOCK_KV]
            ok = (pages >= 0) & (pages < vals.shape[0])
            t, pages = t[ok], pages[ok]
            k = vals[pages, t % BLOCK_KV]  # [L', D]
            s = scales[pages, t % BLOCK_KV]  # [L']
            dots = torch.einsum("hd,td->ht", qd[i, j], k)
            if not magnitude:
                dots = dots.clamp(min=0)
            out[r, t] = s * (w[r][:, None] * dots).sum(0)
    return out


def paged_mqa_logits_ref(q, kv_cache, weights, context_lens, block_table, max_context_len):
    """float64 [b*next_n, max_context_len]; -inf past each row's length and at every token whose block-table column is
    past the table or whose page id is < 0 or >= num_blocks (skipped)."""
    return _paged_rows(q, kv_cache, weights, context_lens, block_table, max_context_len, magnitude=False)


def paged_mqa_logits_magnitude(q, kv_cache, weights, context_lens, block_table, max_context_len):
    """float64 bound scale[t] * sum_h |w| * sum_d |q k| (for per-element tolerances)."""
    return _paged_rows(q, kv_cache, weights, context_lens, block_table, max_context_len, magnitude=True)


def mqa_logits_ref(q, kv, weights, ks, ke, max_seqlen_k=0, magnitude=False):
    """Flat logits, float64. max_seqlen_k == 0: [rows, n] absolute columns; else [rows, max_seqlen_k]
    with column c = position ks[row] + c. -inf outside [ks, ke)."""
    k8, ksc = kv
    k = k8.cpu().double()
    s = ksc.cpu().double()
    qd = q.cpu().double()
    w = weights.cpu().double()
    if magnitude:
        k, s, qd, w = k.abs(), s.abs(), qd.abs(), w.abs()
    M, H, D = q.shape
    n = k.shape[0]
    width = max_seqlen_k if max_seqlen_k > 0 else n
    out = torch.full((M, width), float("-inf"), dtype=torch.float64)
    dots = torch.einsum("mhd,nd->mhn", qd, k)
    if not magnitude:
        dots = dots.clamp(min=0)
    full = (w[:, :, None] * dots).sum(1) * s[None, :]  # [M, n]
    ks_l, ke_l = ks.cpu().long().tolist(), ke.cpu().long().tolist()
    for r in range(M):
        a, b = max(ks_l[r], 0), min(ke_l[r], n)
        if b <= a:
            continue
        if max_seqlen_k > 0:
            b = min(b, a + width)
            out[r, : b - a] = full[r, a:b]
        else:
            out[r, a:b] = full[r, a:b]
    return out
