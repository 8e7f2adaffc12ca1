"""Float64 reference for the sparse FP8 MLA decode (FlashMLA ``flash_mla_with_kvcache`` with
``indices``), written from docs/sparse_decode.md, plus the fp8_ds_mla ("MODEL1") cache packer.

Page layout (one contiguous run of ``page_stride`` bytes per page, page_stride >= page_size*584):
  [0, page_size*576)              per token: 448 fp8_e4m3 NoPE values, then 64 bf16 RoPE values;
  [page_size*576, page_size*584)  per token: 7 UE8M0 scale bytes (scale j covers NoPE [64j, 64j+64)), 1 pad.
"""
import math
from typing import NamedTuple, Optional

import torch

D, NOPE, ROPE = 512, 448, 64
ROW, SROW, TOKEN_BYTES = 576, 8, 584
FP8_MAX = 448.0


def _raw_pages(cache: torch.Tensor) -> torch.Tensor:
    """uint8 [num_pages, page_stride] view of the cache's real bytes."""
    c = cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache
    return torch.as_strided(c, (c.shape[0], c.stride(0)), (c.stride(0), 1))


def pack_fp8_ds_mla(kv: torch.Tensor, page_size: int, page_stride_bytes: Optional[int] = None) -> torch.Tensor:
    """Quantise kv [num_tokens, 512] (any float dtype; RoPE part stored as bf16) into the paged cache.

    Returns a uint8 tensor viewed as [num_pages, page_size, 1, 584] whose stride(0) is page_stride_bytes
    (default page_size*584). Token t lives in page t // page_size, row t % page_size; the tail of the
    last page is zero. Scale per 64 NoPE values: the smallest power of two 2^e with amax / 2^e <= 448.
    """
    assert kv.dim() == 2 and kv.shape[1] == D
    n = kv.shape[0]
    stride = page_stride_bytes or page_size * TOKEN_BYTES
    assert stride >= page_size * TOKEN_BYTES
    num_pages = max(1, (n + page_size - 1) // page_size)
    kvf = kv.detach().to("cpu", torch.float32)
    nope = kvf[:, :NOPE].reshape(n, 7, 64)
    amax = nope.abs().amax(dim=-1).clamp_min(1e-30)
    e = torch.ceil(torch.log2(amax / FP8_MAX)).clamp(-127, 127).to(torch.int32)   # [n, 7]
    scaled = nope / torch.pow(2.0, e.to(torch.float32)).unsqueeze(-1)
    fp8 = scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, NOPE)
    rope = kvf[:, NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8).reshape(n, 2 * ROPE)
    raw = torch.zeros(num_pages, stride, dtype=torch.uint8)
    tok = torch.arange(n)
    page, row = tok // page_size, tok % page_size
    data = torch.cat([fp8, rope], dim=1)                                       # [n, 576]
    scales = torch.cat([(e + 127).to(torch.uint8), torch.zeros(n, 1, dtype=torch.uint8)], dim=1)  # [n, 8]
    raw[page.unsqueeze(1), (row * ROW).unsqueeze(1) + torch.arange(ROW)] = data
    raw[page.unsqueeze(1), (page_size * ROW + row * SROW).unsqueeze(1) + torch.arange(SROW)] = scales
    flat = raw.reshape(-1)
    return torch.as_strided(flat, (num_pages, page_size, 1, TOKEN_BYTES), (stride, TOKEN_BYTES, TOKEN_BYTES, 1))


def unpack_fp8_ds_mla(cache: torch.Tensor) -> torch.Tensor:
    """Dequantise a paged cache ([num_pages, page_size, ...] view, real layout above) to float64
    [num_pages*page_size, 512]."""
    page_size = cache.shape[1]
    raw = _raw_pages(cache).cpu()
    p = raw.shape[0]
    data = raw[:, : page_size * ROW].reshape(p * page_size, ROW)
    sc = raw[:, page_size * ROW: page_size * (ROW + SROW)].reshape(p * page_size, SROW)[:, :7]
    nope = data[:, :NOPE].contiguous().view(torch.float8_e4m3fn).to(torch.float64).reshape(-1, 7, 64)
    scale = torch.pow(2.0, sc.to(torch.float64) - 127.0).unsqueeze(-1)
    rope = data[:, NOPE:].contiguous().view(torch.bfloat16).to(torch.float64)
    return torch.cat([(nope * scale).reshape(-1, NOPE), rope], dim=1)


class ErrorScales(NamedTuple):
    """sparse_decode_ref(..., error_scales=True)'s third result (see there)."""
    out_abs: torch.Tensor      # [b, s_q, h_q, 512]
    row_spread: torch.Tensor   # [b, s_q, h_q]


# The bounds on a kernel's bf16 out (tests/test_sparse_decode.py's docstring derives them): each softmax weight
# rounded to bf16 for P V and out rounded to bf16 once, K / V exact, fp32 sums. Per element |out - ref| <=
# OUT_ELEM_RTOL (out_abs + |ref|) + OUT_ATOL (twice the worst case); per head row ||out - ref|| <=
# OUT_ROW_RTOL (||ref|| + 2 row_spread) + OUT_ATOL (the rounding errors of distinct slots being independent).
OUT_ELEM_RTOL, OUT_ROW_RTOL, OUT_ATOL = 2.0 ** -7, 2.0 ** -8, 1e-5


def out_error_ratios(out, ref_out, scales: ErrorScales):
    """(per element [b, s_q, h_q, 512], per head row [b, s_q, h_q]): |out - ref_out| as a fraction of the bounds
    above (<= 1: within), float64 on the CPU; ref_out and scales from sparse_decode_ref(..., error_scales=True)."""
    d = out.detach().cpu().to(torch.float64) - ref_out
    elem = d.abs() / (OUT_ELEM_RTOL * (scales.out_abs + ref_out.abs()) + OUT_ATOL)
    row = d.norm(dim=-1) / (OUT_ROW_RTOL * (ref_out.norm(dim=-1) + 2 * scales.row_spread) + OUT_ATOL)
    return elem, row


def _gather(cache, indices, lengths):
    """K [b, s_q, topk, 512] float64, valid mask [b, s_q, topk], slot ids [b, s_q, topk] (the index where valid, -1
    elsewhere) and the cache's row count."""
    kv = unpack_fp8_ds_mla(cache)
    idx = indices.detach().cpu().to(torch.int64)
    b, s_q, topk = idx.shape
    valid = (idx >= 0) & (idx < kv.shape[0])
    if lengths is not None:
        pos = torch.arange(topk).view(1, 1, topk)
        valid &= pos < lengths.detach().cpu().to(torch.int64).view(b, 1, 1)
    k = kv[idx.clamp(0, kv.shape[0] - 1)]
    k = torch.where(valid.unsqueeze(-1), k, torch.zeros((), dtype=torch.float64))
    return k, valid, torch.where(valid, idx, torch.full_like(idx, -1)), kv.shape[0]


def _slot_weight_sums(w, slots):
    """w [b, s_q, h_q, T] -> [b, s_q, h_q, T]: at each position, the sum of w over the positions of its row (b, s_q)
    that hold the same slot (ids [b, s_q, T], -1 = none: each such position on its own)."""
    b, s_q, h_q, t = w.shape
    if w.numel() == 0:
        return w.clone()
    n = int(slots.max()) + 1
    own = n + torch.arange(t).view(1, 1, t)                         # an invalid position is its own group
    rows = torch.arange(b * s_q).view(b, s_q, 1)
    key = rows * (n + t) + torch.where(slots >= 0, slots, own)      # one int64 per (row, slot); 1-D unique is fast
    _, group = torch.unique(key.reshape(-1), return_inverse=True)
    flat = w.permute(2, 0, 1, 3).reshape(h_q, -1)
    sums = torch.zeros(h_q, int(group.max()) + 1, dtype=w.dtype).index_add_(1, group, flat)
    return sums[:, group].reshape(h_q, b, s_q, t).permute(1, 2, 0, 3)


def sparse_decode_ref(q, k_cache, indices, topk_length=None, extra_k_cache=None, extra_indices=None,
                      extra_topk_length=None, attn_sink=None, softmax_scale=None, error_scales=False):
    """Returns (out [b, s_q, h_q, 512] float64, lse [b, h_q, s_q] float64).

    lse = log(sum_j exp(score_j)) over the valid multiset of main + extra slots, WITHOUT attn_sink
    (FlashMLA tests/ref.py convention); out = sum_j exp(score_j) V_j / (exp(lse) + exp(sink)).
    A row with no valid slot: out 0, lse +inf (FlashMLA's "lonely q" convention).
    error_scales: also returns ErrorScales, the scales of the error of a kernel that rounds each weight
    w_j = exp(score_j) / (exp(lse) + exp(sink)) with a relative error e_j (e.g. to bf16 for the P V product), which
    moves out by sum_j e_j w_j V_j: out_abs = sum_j w_j |V_j| [b, s_q, h_q, 512] bounds it per element (times
    max |e_j|); row_spread = sqrt(sum_g W_g^2 ||V_g||^2) [b, s_q, h_q] over the row's distinct slots g, W_g the sum of
    the weights of g's copies, is the root mean square of its norm per head row (times that of e_j) when the errors
    of distinct slots are independent and zero-mean. Copies of one slot share their error (the same score, the same
    rounded weight), so they count as one weight: counted as independent, rows of 512 copies of 2-3 slots whose values
    nearly cancel let the arithmetic above exceed the head-row bound 2.2x . Both 0 for empty rows.
    """
    qf = q.detach().cpu().to(torch.float64)
    b, s_q, h_q, d = qf.shape
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    k, valid, slots, n_main = _gather(k_cache, indices, topk_length)
    if extra_k_cache is not None:
        k2, valid2, slots2, _ = _gather(extra_k_cache, extra_indices, extra_topk_length)
        k, valid = torch.cat([k, k2], 2), torch.cat([valid, valid2], 2)
        slots = torch.cat([slots, torch.where(slots2 >= 0, slots2 + n_main, slots2)], 2)   # extra rows after main
    s = torch.einsum("bshd,bstd->bsht", qf, k) * scale
    s = s.masked_fill(~valid.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                   # [b, s_q, h_q]
    empty = torch.isneginf(lse)
    w = torch.exp(s - torch.where(empty, torch.zeros_like(lse), lse).unsqueeze(-1))
    if attn_sink is not None:
        sink = attn_sink.detach().cpu().to(torch.float64).view(1, 1, h_q)
        w = w / (1.0 + torch.exp(sink - lse)).unsqueeze(-1)
    w = torch.where(empty.unsqueeze(-1), torch.zeros_like(w), w)
    out = torch.einsum("bsht,bstd->bshd", w, k)
    lse = torch.where(empty, torch.full_like(lse, math.inf), lse).permute(0, 2, 1).contiguous()
    if not error_scales:
        return out, lse
    # sum over distinct slots g of W_g^2 ||V_g||^2 (W_g: the weights of g's copies) = sum_j w_j W_g(j) ||V_j||^2
    spread = torch.einsum("bsht,bst->bsh", w * _slot_weight_sums(w, slots), (k * k).sum(-1)).sqrt()
    return out, lse, ErrorScales(torch.einsum("bsht,bstd->bshd", w, k.abs()), spread)
