"""Float64 reference of DeepSeek-V4 MXFP4 routed experts, plus an MXFP4 packer.

Format (verified against SGLang's DSV4 loader, see docs/fp4_moe.md):
  * weight W [N, K] is stored as uint8/int8 [N, K/2]: element 2j in the LOW nibble of
    byte j, element 2j+1 in the HIGH nibble; each nibble is e2m1
    (sign bit 3, exponent bits 2..1, mantissa bit 0; values 0, .5, 1, 1.5, 2, 3, 4, 6);
  * scale [N, K/32]: one UE8M0 exponent per 32 consecutive K values, value 2^(s-127).
    Stored as uint8 bits or torch.float8_e8m0fnu in the checkpoint; SGLang keeps it in
    a float32 parameter holding the power of two itself.
  * W13 = [W1 (gate); W3 (up)] along N ([2I, hidden]); W2 = down ([hidden, I]).

MoE block (one token t, experts e_k with routing weights w_k):
  g, u   = x W1_e^T, x W3_e^T
  (DSV4: g = min(g, limit), u = clamp(u, -limit, limit) when swiglu_limit is given)
  h      = silu(g) * u
  out[t] = rsf * sum_k w_k * (h W2_e^T)    (rsf = routed_scaling_factor, default 1)
Slots whose expert id is < 0 or >= E (expert parallelism: not local) contribute nothing.
"""
from __future__ import annotations

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
GROUP = 32


def _table(device, dtype=torch.float64):
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=device)


def scale_to_exponent(scale: torch.Tensor) -> torch.Tensor:
    """UE8M0 exponent bits (int64) from uint8 bits, float8_e8m0fnu or float32 powers of two."""
    if scale.dtype == torch.uint8:
        return scale.long()
    if hasattr(torch, "float8_e8m0fnu") and scale.dtype == torch.float8_e8m0fnu:
        return scale.view(torch.uint8).long()
    if scale.dtype == torch.float32:
        bits = scale.contiguous().view(torch.int32).long()
        return (bits >> 23) & 0xFF
    raise TypeError(f"unsupported scale dtype {scale.dtype}")


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] uint8/int8 -> [..., K] float64 e2m1 values (low nibble first)."""
    b = packed.view(torch.uint8).long()
    lo, hi = b & 0xF, (b >> 4) & 0xF
    t = _table(packed.device)
    return torch.stack([t[lo], t[hi]], dim=-1).flatten(-2)


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[..., N, K/2] packed + [..., N, K/32] scale -> [..., N, K] float64."""
    v = unpack_e2m1(packed)
    e = scale_to_exponent(scale).to(torch.float64)
    s = torch.exp2(e - 127.0).repeat_interleave(GROUP, dim=-1)
    return v * s


# midpoints between neighbouring e2m1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def quantize_mxfp4(w: torch.Tensor, scale_dtype=torch.uint8):
    """Quantise real weights [..., N, K] (K % 32 == 0) to MXFP4.

    Scale per 32-group: 2^ceil(log2(amax / 6)) (so no element clips; all-zero groups get
    2^-127); elements rounded to the nearest e2m1 value, ties to the even code. Works in
    float32 on w's device (weights are bf16/fp32: dividing by a power of two is exact).
    Returns (packed uint8 [..., N, K/2], scale [..., N, K/32] as uint8 bits,
    float8_e8m0fnu or float32 powers of two).
    """
    if w.shape[-1] % GROUP:
        raise ValueError(f"K={w.shape[-1]} must be a multiple of {GROUP}")
    g = w.to(torch.float32).unflatten(-1, (-1, GROUP))
    amax = g.abs().amax(-1).to(torch.float64)
    m, e = torch.frexp(amax / 6.0)  # amax/6 = m * 2^e, m in [0.5, 1)
    exp = torch.where(m == 0.5, e - 1, e).to(torch.float64)
    exp = torch.where(amax > 0, exp, torch.full_like(exp, -127.0)).clamp(-127, 127)
    q = g * torch.exp2(-exp).to(torch.float32)[..., None]
    del g
    mag = q.abs()
    b = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=w.device)
    down = torch.bucketize(mag, b, right=False)  # a value on a midpoint -> lower code
    up = torch.bucketize(mag, b, right=True)     # ... -> upper code
    code = torch.where(down % 2 == 0, down, up)  # ties to the even code
    del mag, down, up
    code = code | ((q < 0) & (code > 0)).long() << 3
    del q
    code = code.flatten(-2)
    packed = (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)
    bits = (exp + 127).to(torch.uint8)
    if scale_dtype == torch.uint8:
        scale = bits
    elif scale_dtype == torch.float32:
        scale = torch.exp2(exp).to(torch.float32)
    elif hasattr(torch, "float8_e8m0fnu") and scale_dtype == torch.float8_e8m0fnu:
        scale = bits.view(torch.float8_e8m0fnu)
    else:
        raise ValueError(f"unsupported scale dtype {scale_dtype}")
    return packed, scale


def quantize_act_mxfp8(x: torch.Tensor) -> torch.Tensor:
    """MXFP8 rounding of activations [..., K] (K % 32 == 0), returned as float64 values.

    Per 32 consecutive K values: scale = 2^(ceil(log2 amax) - 8) (>= 2^-126), so |x|/scale
    <= 256 never saturates e4m3 (max 448); x/scale rounded to e4m3 (nearest, ties even)."""
    g = x.to(torch.float64).unflatten(-1, (-1, GROUP))
    amax = g.abs().amax(-1)
    m, e = torch.frexp(amax)  # amax = m * 2^e, m in [0.5, 1)
    ceil_log2 = torch.where(m == 0.5, e - 1, e)
    sexp = torch.clamp(ceil_log2 - 8, min=-126).to(torch.float64)
    scale = torch.exp2(sexp)[..., None]
    q = (g / scale).to(torch.float8_e4m3fn).to(torch.float64) * scale
    return q.flatten(-2)


def fp4_moe_reference(hidden_states, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
                      swiglu_limit=None, routed_scaling_factor=None, act_quant=None):
    """Float64 MoE block; returns [M, hidden] float64.

    act_quant="mxfp8" models activations rounded to MXFP8 before each GEMM (x as given,
    h after rounding to bf16), as in the kernel's "mxfp8" variant."""
    if act_quant not in (None, "mxfp8"):
        raise ValueError(f"act_quant must be None or 'mxfp8', got {act_quant!r}")
    x = hidden_states.to(torch.float64)
    if act_quant == "mxfp8":
        x = quantize_act_mxfp8(x)
    M = x.shape[0]
    out = torch.zeros(M, w2.shape[1], dtype=torch.float64, device=x.device)
    ids = topk_ids.long()
    wts = topk_weights.to(torch.float64)
    inter = w2.shape[2] * 2
    for e in torch.unique(ids).tolist():
        if e < 0 or e >= w13.shape[0]:  # not a local expert (EP): contributes nothing
            continue
        t, k = torch.nonzero(ids == e, as_tuple=True)
        w13e = dequantize_mxfp4(w13[e], w13_scale[e])
        w2e = dequantize_mxfp4(w2[e], w2_scale[e])
        gu = x[t] @ w13e.T
        g, u = gu[:, :inter], gu[:, inter:]
        if swiglu_limit is not None:
            g = g.clamp(max=swiglu_limit)
            u = u.clamp(min=-swiglu_limit, max=swiglu_limit)
        h = g * torch.sigmoid(g) * u
        if act_quant == "mxfp8":
            h = quantize_act_mxfp8(h.to(torch.bfloat16))
        y = h @ w2e.T
        out.index_add_(0, t, y * wts[t, k][:, None])
    if routed_scaling_factor is not None:
        out = out * routed_scaling_factor
    return out
