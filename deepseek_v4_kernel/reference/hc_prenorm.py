"""float64 reference for DeepGEMM's ``tf32_hc_prenorm_gemm`` (written from the spec).

Split s covers DeepGEMM's K slice: K is cut into 64-wide blocks (the last may be
short), split s gets ``nb // S`` blocks plus one if ``s < nb % S``, in order.
"""
import torch

KBLOCK = 64


def split_bounds(K: int, num_splits):
    """[(k_begin, k_end)] of each split, DeepGEMM's partition."""
    S = 1 if num_splits is None else int(num_splits)
    nb = (K + KBLOCK - 1) // KBLOCK
    per, rem = divmod(nb, S)
    bounds, b = [], 0
    for s in range(S):
        c = per + (1 if s < rem else 0)
        bounds.append((min(b * KBLOCK, K), min((b + c) * KBLOCK, K)))
        b += c
    return bounds


def hc_prenorm_gemm_ref(x: torch.Tensor, fn: torch.Tensor, num_splits=None):
    """Returns (out, sqrsum) in float64: [S, m, n] / [S, m] (or [m, n] / [m] for None)."""
    xd = x.to(torch.float64)
    fd = fn.to(torch.float64)
    outs, sqs = [], []
    for k0, k1 in split_bounds(x.shape[1], num_splits):
        xs = xd[:, k0:k1]
        outs.append(xs @ fd[:, k0:k1].T)
        sqs.append((xs * xs).sum(-1))
    out = torch.stack(outs)
    sq = torch.stack(sqs)
    if num_splits is None:
        return out[0], sq[0]
    return out, sq


def hc_prenorm_abs_scale(x: torch.Tensor, fn: torch.Tensor, num_splits=None) -> torch.Tensor:
    """float64 [S, m, n] (S = 1 for None): sum over split s's slice of |x[i, k]| |fn[j, k]|, the scale the rounding
    bounds of the tests (and tools/stress_hc_prenorm.py) are taken against."""
    xa = x.to(torch.float64).abs()
    fa = fn.to(torch.float64).abs()
    return torch.stack([xa[:, a:b] @ fa[:, a:b].T for a, b in split_bounds(x.shape[1], num_splits)])
