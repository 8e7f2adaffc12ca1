"""Triton kernels of the mHC pre-norm GEMM (host side: api.py; the rules that pick a launch: dispatch.py).

``_hc_prenorm_kernel``: grid (m tiles, S * P). Each program streams its K range once (x read once, fn from L2),
accumulates x @ fn^T on tensor cores (fn split into bf16 hi + lo: two bf16 MMAs, at least DeepGEMM's tf32 accuracy)
and sum(x^2) on the side. With P > 1 sub-slices per caller split, programs leave fp32 partials in a workspace and the
partials of one (m tile, split) group are summed in a fixed order by R reducers that wait on an acq_rel counter (the
kernel resets its counters itself, so CUDA-graph replays need no memset). ``_fn_split_kernel`` splits fn into bf16
hi / lo planes once per call for the ``presplit`` configs. Design: docs/hc_prenorm.md.
"""
from __future__ import annotations

import triton
import triton.language as tl

# --------------------------------------------------------------------------- kernel
@triton.jit
def _dot_hi_lo(acc, xt, xf, hi, lo, INTERP: tl.constexpr):
    # acc += x @ (hi + lo) as two bf16 MMAs
    if INTERP:  # the interpreter's bf16 dot is broken; same products in fp32
        acc = tl.dot(xf, hi.to(tl.float32), acc, input_precision="ieee")
        acc = tl.dot(xf, lo.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(xt, hi, acc)
        acc = tl.dot(xt, lo, acc)
    return acc


@triton.jit
def _step(acc, sq, x_base, f_base, k0, k_hi, kk, row_ok, col_ok, stride_xk, stride_fk, f_plane,
          BF16X2: tl.constexpr, FMA: tl.constexpr, PRESPLIT: tl.constexpr, INTERP: tl.constexpr,
          SQ2D: tl.constexpr = False):
    ks = k0 + kk
    k_ok = ks < k_hi
    xt = tl.load(x_base + ks[None, :] * stride_xk,
                 mask=row_ok[:, None] & k_ok[None, :], other=0.0)
    xf = xt.to(tl.float32)
    if SQ2D:  # element-wise partial sums, reduced across threads once after the K loop
        sq += xf * xf
    else:
        sq += tl.sum(xf * xf, axis=1)
    if PRESPLIT:
        # fn already split into bf16 hi / lo planes (_fn_split_kernel, f_plane elements apart): both
        # tiles go global -> shared -> MMA operand as loaded, with no per-tile conversion
        f_mask = k_ok[:, None] & col_ok[None, :]
        hi = tl.load(f_base + ks[:, None] * stride_fk, mask=f_mask, other=0.0)
        lo = tl.load(f_base + f_plane + ks[:, None] * stride_fk, mask=f_mask, other=0.0)
        acc = _dot_hi_lo(acc, xt, xf, hi, lo, INTERP)
    elif FMA:
        # CUDA-core path for a few rows: fn tile [NP, BLOCK_K] (K contiguous, as x),
        # exact fp32 products, no shared memory, no MMA padding of the rows.
        ft = tl.load(f_base + ks[None, :] * stride_fk,
                     mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(xf[:, None, :] * ft[None, :, :], axis=2)
    else:
        ft = tl.load(f_base + ks[:, None] * stride_fk,
                     mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if BF16X2:
            hi = ft.to(tl.bfloat16)
            lo = (ft - hi.to(tl.float32)).to(tl.bfloat16)
            acc = _dot_hi_lo(acc, xt, xf, hi, lo, INTERP)
        else:
            acc = tl.dot(xf, ft, acc, input_precision="tf32")
    return acc, sq


@triton.jit
def _fn_split_kernel(fn_ptr, dst_ptr, n, K, stride_fn, stride_fk,
                     BLOCK: tl.constexpr, PDL: tl.constexpr):
    # fn fp32 [n, K] -> dst bf16 [2, n, K]: hi = bf16(fn), lo = bf16(fn - hi), the same roundings as
    # the per-tile split of _step (BF16X2), done once per call instead of once per m tile
    if PDL:
        tl.extra.cuda.gdc_wait()  # fn may come from an earlier kernel
        tl.extra.cuda.gdc_launch_dependents()  # the GEMM grid may be scheduled now; it waits for us
    row = tl.program_id(1)
    ks = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = ks < K
    f = tl.load(fn_ptr + row * stride_fn + ks * stride_fk, mask=ok, other=0.0)
    hi = f.to(tl.bfloat16)
    lo = (f - hi.to(tl.float32)).to(tl.bfloat16)
    d = dst_ptr + row.to(tl.int64) * K + ks
    tl.store(d, hi, mask=ok)
    tl.store(d + n * K, lo, mask=ok)


@triton.jit
def _gather(tot, tsq, ws_ptr, wss_ptr, z0, q0, P, m, r64, r_ok, cols, col_ok,
            NP: tl.constexpr, PB: tl.constexpr):
    # PB partials x RB rows x NP columns in one load, summed over the partials
    qs = q0 + tl.arange(0, PB)
    q_ok = qs < P
    base = (z0 + qs).to(tl.int64)[:, None] * m + r64[None, :]  # [PB, RB]
    qr_ok = q_ok[:, None] & r_ok[None, :]
    t = tl.load(ws_ptr + base[:, :, None] * NP + cols[None, None, :],
                mask=qr_ok[:, :, None] & col_ok[None, None, :], other=0.0,
                cache_modifier=".cg")
    tot += tl.sum(t, axis=0)
    tsq += tl.sum(tl.load(wss_ptr + base, mask=qr_ok, other=0.0, cache_modifier=".cg"), axis=0)
    return tot, tsq


@triton.jit
def _hc_prenorm_kernel(
    x_ptr, fn_ptr, out_ptr, sq_ptr, ws_ptr, wss_ptr, cnt_ptr,
    m, n, K, S, P,
    stride_xm, stride_xk, stride_fn, stride_fk,
    stride_os, stride_om, stride_on, stride_ss, stride_sm, f_plane,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, NP: tl.constexpr,
    KB: tl.constexpr, USE_WS: tl.constexpr, BF16X2: tl.constexpr, FMA: tl.constexpr,
    PRESPLIT: tl.constexpr, SQ2D: tl.constexpr,
    R: tl.constexpr, RB: tl.constexpr, PB: tl.constexpr,
    INTERP_IT: tl.constexpr, INTERP_PQ: tl.constexpr, PDL: tl.constexpr,
):
    # With the workspace (P > 1) the last R arrivals of each (m tile, split) group reduce
    # its P partials, RB = BLOCK_M // R rows each, PB partials x RB rows per load.
    # INTERP_IT / INTERP_PQ > 0 only under TRITON_INTERPRET=1: triton 3.6's interpreter
    # (numpy >= 2.3) cannot run range() with runtime bounds, so there the loops run a
    # host-computed constant trip count over the same masked body.
    if PDL:  # launched with programmatic dependent launch: x (and our counters) come from earlier kernels
        tl.extra.cuda.gdc_wait()
    pid_m = tl.program_id(0)
    pid_z = tl.program_id(1)
    s = pid_z // P
    p = pid_z % P

    # DeepGEMM's partition of the 64-wide K blocks over S splits ...
    nb = (K + KB - 1) // KB
    per = nb // S
    rem = nb % S
    b0 = s * per + tl.minimum(s, rem)
    nbs = per + (s < rem).to(tl.int32)
    # ... and our own partition of split s over its P sub-slices.
    per2 = nbs // P
    rem2 = nbs % P
    c0 = b0 + p * per2 + tl.minimum(p, rem2)
    ncs = per2 + (p < rem2).to(tl.int32)
    k_lo = c0 * KB
    k_hi = tl.minimum((c0 + ncs) * KB, K)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < m
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, NP)
    col_ok = cols < n
    kk = tl.arange(0, BLOCK_K)

    acc = tl.zeros((BLOCK_M, NP), dtype=tl.float32)
    if SQ2D:
        sq = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    else:
        sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    x_base = x_ptr + rows64[:, None] * stride_xm
    if FMA:
        f_base = fn_ptr + cols[:, None] * stride_fn
    else:
        f_base = fn_ptr + cols[None, :] * stride_fn
    if INTERP_IT > 0:
        for it in range(0, INTERP_IT):
            acc, sq = _step(acc, sq, x_base, f_base, k_lo + it * BLOCK_K, k_hi, kk, row_ok,
                            col_ok, stride_xk, stride_fk, f_plane, BF16X2, FMA, PRESPLIT, True, SQ2D)
    else:
        for k0 in range(k_lo, k_hi, BLOCK_K):
            acc, sq = _step(acc, sq, x_base, f_base, k0, k_hi, kk, row_ok, col_ok,
                            stride_xk, stride_fk, f_plane, BF16X2, FMA, PRESPLIT, False, SQ2D)

    if SQ2D:
        sq = tl.sum(sq, axis=1)
    o_mask = row_ok[:, None] & col_ok[None, :]
    if USE_WS:
        # partial of (split s, sub-slice p): ws [S*P, m, NP], wss [S*P, m]
        w_ptrs = ws_ptr + (pid_z.to(tl.int64) * m + rows64[:, None]) * NP + cols[None, :]
        tl.store(w_ptrs, acc, mask=o_mask)
        tl.store(wss_ptr + pid_z.to(tl.int64) * m + rows64, sq, mask=row_ok)
        tl.debug_barrier()
        # two int32 per group: arrivals, finished reducers
        c_ptr = cnt_ptr + 2 * (pid_m * S + s)
        old = tl.atomic_add(c_ptr, 1, sem="acq_rel", scope="gpu")
        if R == 1:
            is_red = old == P - 1  # the last arrival reduces (j = 0)
        else:
            # the R sub-slices with the highest program ids reduce, row chunk j each:
            # they wait for the rest of the group, whose ids are all lower, so those
            # were dispatched before them (the CUTLASS stream-K fix-up argument).
            is_red = p >= P - R
        if is_red:
            j = 0
            if R > 1:
                j = p - (P - R)
                cur = old + 1
                while cur < P:
                    cur = tl.atomic_add(c_ptr, 0, sem="acquire", scope="gpu")
            z0 = s * P
            r0 = pid_m * BLOCK_M + j * RB
            if r0 < m:
                r = r0 + tl.arange(0, RB)
                r_ok = r < m
                r64 = r.to(tl.int64)
                tot = tl.zeros((RB, NP), dtype=tl.float32)
                tsq = tl.zeros((RB,), dtype=tl.float32)
                if INTERP_PQ > 0:
                    for qi in range(0, INTERP_PQ):
                        tot, tsq = _gather(tot, tsq, ws_ptr, wss_ptr, z0, qi * PB, P, m, r64,
                                           r_ok, cols, col_ok, NP, PB)
                else:
                    for q0 in range(0, P, PB):  # fixed order: deterministic
                        tot, tsq = _gather(tot, tsq, ws_ptr, wss_ptr, z0, q0, P, m, r64,
                                           r_ok, cols, col_ok, NP, PB)
                tl.store(out_ptr + s * stride_os + r64[:, None] * stride_om
                         + cols[None, :] * stride_on, tot,
                         mask=r_ok[:, None] & col_ok[None, :])
                tl.store(sq_ptr + s * stride_ss + r64 * stride_sm, tsq, mask=r_ok)
            # reset the counters for the next launch / graph replay (no memset needed)
            if R > 1:
                done = tl.atomic_add(c_ptr + 1, 1, sem="acq_rel", scope="gpu")
                if done == R - 1:  # every reducer has stopped reading the arrivals
                    tl.atomic_xchg(c_ptr + 1, 0, sem="relaxed", scope="gpu")
                    tl.atomic_xchg(c_ptr, 0, sem="relaxed", scope="gpu")
            else:
                tl.atomic_xchg(c_ptr, 0, sem="relaxed", scope="gpu")
    else:
        o_ptrs = out_ptr + s * stride_os + rows64[:, None] * stride_om + cols[None, :] * stride_on
        tl.store(o_ptrs, acc, mask=o_mask)
        tl.store(sq_ptr + s * stride_ss + rows64 * stride_sm, sq, mask=row_ok)

