"""Float64 reference of the block-scaled FP8 linear (ops/fp8_linear), and the packers of its weight-scale forms.

    y[m, n] = sum_k x[m, k] * w[n, k] * s[n // bn, k // bk]  (+ bias[n])      w e4m3, s = SGLang's weight_scale_inv
    grouped: y[m, g, n] = sum_k x[m, g, k] * w[g, n, k] * s[g, n // 128, k // 128]   (DeepSeek-V4's wo_a einsum
             "bhr,hdr->bhd" of deep_gemm.fp8_einsum)

Scale forms (what SGLang keeps in ``weight_scale_inv``):
* float32 [.., ceil(N / bn), ceil(K / bk)]: any positive value (w_real = w_fp8 * scale);
* UE8M0 [.., ceil(N / 128), ceil(K / 128)] as uint8 or torch.float8_e8m0fnu: 2^(byte - 127);
* DeepGEMM's packed UE8M0 (SM100 / SM120 with DeepGEMM, ``requant_weight_ue8m0`` ->
  ``transform_scale_ue8m0`` for linears, ``transform_sf_into_required_layout(..., recipe=(1, 128, 128))`` for
  wo_a): int32 [.., N, ceil(ceil(K / 128) / 4)], one row per output row (the 128-row block's scale repeated), byte j
  of word w = the UE8M0 scale of K block 4 w + j, MN-major strides (stride(-2) = 1, stride(-1) = N rounded up to
  4), see pack_ue8m0_deepgemm.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch

E4M3_MAX = 448.0


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def ue8m0_bytes(scale: torch.Tensor) -> torch.Tensor:
    """uint8 view of UE8M0 scales given as uint8 or float8_e8m0fnu."""
    if scale.dtype == torch.uint8:
        return scale
    if hasattr(torch, "float8_e8m0fnu") and scale.dtype == torch.float8_e8m0fnu:
        return scale.view(torch.uint8)
    raise TypeError(f"UE8M0 scales must be uint8 or float8_e8m0fnu, got {scale.dtype}")


def _ue8m0_to_f64(b: torch.Tensor) -> torch.Tensor:
    b = b.to(torch.int64)
    v = torch.pow(torch.tensor(2.0, dtype=torch.float64, device=b.device), (b - 127).to(torch.float64))
    return torch.where(b == 255, torch.full_like(v, float("nan")), v)


def unpack_ue8m0_deepgemm(packed: torch.Tensor, K: int) -> torch.Tensor:
    """int32 [.., N, ceil(Kb / 4)] (any strides) -> uint8 [.., N, Kb] per-row UE8M0 bytes (Kb = ceil(K / 128))."""
    kb = ceil_div(K, 128)
    words = packed.to(torch.int64) & 0xFFFFFFFF
    parts = [(words >> (8 * j)) & 0xFF for j in range(4)]
    bytes_ = torch.stack(parts, dim=-1).flatten(-2)          # [.., N, 4 * words]
    return bytes_[..., :kb].to(torch.uint8)


def row_scales_f64(scale: torch.Tensor, N: int, K: int, block_size: Sequence[int] = (128, 128)) -> torch.Tensor:
    """Any accepted scale form -> float64 [.., N, ceil(K / bk)]: the scale of (row n, K block)."""
    bn = int(block_size[0])
    if scale.dtype == torch.int32:
        return _ue8m0_to_f64(unpack_ue8m0_deepgemm(scale, K))
    if scale.dtype == torch.float32:
        s = scale.to(torch.float64)
    else:
        s = _ue8m0_to_f64(ue8m0_bytes(scale))
    return s.repeat_interleave(bn, dim=-2)[..., :N, :]


def dequantize(w: torch.Tensor, scale: torch.Tensor, block_size: Sequence[int] = (128, 128)) -> torch.Tensor:
    """e4m3 [.., N, K] + scales -> float64 real weights [.., N, K]."""
    N, K = w.shape[-2], w.shape[-1]
    bk = int(block_size[1])
    s = row_scales_f64(scale, N, K, block_size).repeat_interleave(bk, dim=-1)[..., :K]
    return w.to(torch.float64) * s


def fp8_linear_reference(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                         block_size: Sequence[int] = (128, 128), bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float64 [M, N] = x [M, K] @ dequantize(w)^T (+ bias)."""
    y = x.to(torch.float64) @ dequantize(w, scale, block_size).transpose(-1, -2)
    if bias is not None:
        y = y + bias.to(torch.float64)
    return y


def fp8_grouped_linear_reference(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float64 [M, G, N] = einsum("mgk,gnk->mgn", x, dequantize(w))."""
    return torch.einsum("mgk,gnk->mgn", x.to(torch.float64), dequantize(w, scale))


def abs_bound(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, block_size=(128, 128), grouped=False):
    """A = |x| @ |w_real|^T (float64): the scale of every rounding error of the sum."""
    wr = dequantize(w, scale, block_size).abs()
    xa = x.to(torch.float64).abs()
    if grouped:
        return torch.einsum("mgk,gnk->mgn", xa, wr)
    return xa @ wr.transpose(-1, -2)


def quantize_block_fp8(w: torch.Tensor, block_size: Sequence[int] = (128, 128), ue8m0: bool = False
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Real weights [.., N, K] -> (e4m3 [.., N, K], scales): per (bn x bk) block scale = amax / 448 (float32), or
    its power of two rounded up (ue8m0=True: uint8 UE8M0 bytes, as DeepSeek-V4's checkpoint and DeepGEMM's
    ``per_block_cast_to_fp8(use_ue8m0=True)`` store them). w_fp8 = w / scale, saturated to +-448."""
    bn, bk = int(block_size[0]), int(block_size[1])
    *lead, N, K = w.shape
    nb, kb = ceil_div(N, bn), ceil_div(K, bk)
    wp = torch.zeros(*lead, nb * bn, kb * bk, dtype=torch.float32, device=w.device)
    wp[..., :N, :K] = w.float()
    blocks = wp.view(*lead, nb, bn, kb, bk)
    amax = blocks.abs().amax(dim=(-3, -1)).clamp_min(1e-12)     # [.., nb, kb]
    s = amax / E4M3_MAX
    if ue8m0:
        e = torch.ceil(torch.log2(s)).clamp(-127, 127)
        s = torch.exp2(e)
    q = (blocks / s[..., :, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX)
    q = q.view(*lead, nb * bn, kb * bk)[..., :N, :K].to(torch.float8_e4m3fn)
    if ue8m0:
        return q, (e + 127).to(torch.uint8)
    return q, s.contiguous()


def pack_ue8m0_deepgemm(scale_u8: torch.Tensor, N: int) -> torch.Tensor:
    """uint8 UE8M0 [.., ceil(N / 128), Kb] -> DeepGEMM's packed form: int32 [.., N, ceil(Kb / 4)] (each row the
    128-row block's scales, 4 K blocks per word, K block 4 w + j in byte j), MN-major with the row stride 1 and the
    word stride N rounded up to 4 (the TMA alignment DeepGEMM's get_mn_major_tma_aligned_packed_ue8m0_tensor uses)."""
    lead = scale_u8.shape[:-2]
    kb = scale_u8.shape[-1]
    rows = scale_u8.repeat_interleave(128, dim=-2)[..., :N, :].to(torch.int64)   # [.., N, kb]
    words = ceil_div(kb, 4)
    pad = torch.zeros(*lead, N, words * 4, dtype=torch.int64, device=scale_u8.device)
    pad[..., :kb] = rows
    pad = pad.view(*lead, N, words, 4)
    w = pad[..., 0] | (pad[..., 1] << 8) | (pad[..., 2] << 16) | (pad[..., 3] << 24)
    w = torch.where(w >= 2 ** 31, w - 2 ** 32, w).to(torch.int32)                 # [.., N, words]
    aligned = ceil_div(N, 4) * 4
    g = math.prod(lead) if lead else 1
    out = torch.empty_strided((g, N, words), (aligned * words, 1, aligned), dtype=torch.int32, device=w.device)
    out.copy_(w.reshape(g, N, words))
    return out.view(*lead, N, words) if lead else out[0]
