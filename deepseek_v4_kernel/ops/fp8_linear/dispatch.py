"""Shape-only rules of the FP8 linear: what the compiled kernel covers (``fp8_linear_supported``), which scale form a
tensor is, and how many K splits a call gets (``pick_splits``). Nothing here touches a device or an engine."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from deepseek_v4_kernel.switches import choice, env_int

OP = "fp8_linear"
MAX_M = 64           # DSV4_FP8_LINEAR_MAX_M (params.h): 8 token tiles of the MMA's n = 8
TILE_N = 128         # DSV4_FP8_LINEAR_TILE_N: weight rows per block (8 warps x m16)
STEP_K = 128         # K per step = one scale block
MAX_SPLITS = 64      # DSV4_FP8_LINEAR_MAX_SPLITS
BLOCK_SIZE = (128, 128)

# Scale forms (params.h scale_mode)
MODE_F32, MODE_UE8M0, MODE_PACKED = 0, 1, 2
MODE_NAMES = {MODE_F32: "float32", MODE_UE8M0: "ue8m0", MODE_PACKED: "ue8m0 packed int32 (DeepGEMM)"}

# Split rule constants (pick_splits). Per block: BLOCK_OVERHEAD_STEPS step-times of fixed cost (x conversion
# prologue, partial write, counter); per split and token: PARTIAL_COST_PER_TOKEN of a step for the partials written
# to and summed from L2 by the tile's last block; INFLIGHT_NEED_KB: weight bytes in flight per SM that keep its
# share of DRAM busy (Little's law: ~33 GB/s per SM on an H200 x ~1 us under load). Model constants, not measured
# yet: the first H200 run sweeps `splits=` against them (benchmarks/bench_fp8_linear.py --sweep-splits).
BLOCK_OVERHEAD_STEPS = 1.0
PARTIAL_COST_PER_TOKEN = 0.03
INFLIGHT_NEED_KB = 40.0

# Kernels (params.h DSV4_FP8_LINEAR_KERNEL_*): "ring" (kernel_ring.cuh, the default: weights through a shared-memory
# ring of cp.async stages, x converted once per call), "regs" (kernel.cuh: weights straight to a register ring; A/B).
KERNELS = ("auto", "ring", "regs")
# "auto": the register-ring kernel up to RING_MIN_M - 1 rows, the shared-memory ring from RING_MIN_M. H200 (mma.sync,
# 2026-12-02, benchmarks/bench_fp8_linear.py, every model shape at TP 1): regs / ring time 0.75-0.93x at M 1-8 (e.g.
# wq_b M 1 15.4 against 18.8 us, wo_b 17.6 against 19.2), 0.84-1.13x at M 16, ring 1.08-1.67x faster at M 32-64
# (wq_b M 64 36.4 against 53.6 us, wo_b 34.9 against 58.3).
RING_MIN_M = 32
KERNEL_IDS = {"ring": 0, "regs": 1}
KERNEL_ENV = "DSV4_FP8_LINEAR_KERNEL"
DECODES = ("cvt", "int")
DECODE_ENV = "DSV4_FP8_LINEAR_DECODE"
SPLITS_ENV = "DSV4_FP8_LINEAR_SPLITS"

# Ring kernel (kernel_ring.cuh RingCfg): stages per token-tile count (16 KB of weights each, kStages - 1 in flight,
# one block per SM) and the split rule's fixed cost per block in step-times: the ring's fill (about one loaded DRAM
# latency, ~1.5 us, against ~0.5 us per 16 KB step at an SM's share of the copy rate).
RING_BLOCK_OVERHEAD_STEPS = 3.0
RING_PARTIAL_COST_PER_TOKEN = 0.005   # H200, regs kernel, wq_a at M = 64: 16 splits 17.6 us, 4 splits 31.8 us


def ring_stage_bytes(mt: int) -> int:
    return 16384 + mt * 2048 + mt * 32 + 512   # weights, x fragments, 2^-s per token, scale words


def ring_stages(mt: int) -> int:
    return min(5, 101376 // ring_stage_bytes(mt))


def ring_smem_bytes(mt: int) -> int:
    return ring_stages(mt) * ring_stage_bytes(mt)


def kernel_choice(kernel: Optional[str] = None, M: Optional[int] = None) -> str:
    """The kernel of a call: the keyword, else DSV4_FP8_LINEAR_KERNEL, else "auto"; "auto" with the call's rows M
    resolves to "regs" below RING_MIN_M rows and "ring" from there (without M it stays "auto")."""
    if kernel is None:
        kernel = choice(KERNEL_ENV, KERNELS, "auto")
    if kernel == "auto" and M is not None:
        return "ring" if M >= RING_MIN_M else "regs"
    return kernel


def decode_choice(decode: Optional[str] = None) -> str:
    """The weight decode of a call: the keyword, else DSV4_FP8_LINEAR_DECODE, else "cvt"."""
    if decode is None:
        return choice(DECODE_ENV, DECODES, "cvt")
    return decode


# Mirror of csrc/fp8_linear (fp8_linear.cu kTileCounts, kernel.cuh Cfg): token tiles per M, ring depth, x piece
# steps and blocks per SM of each instance (tests/test_extension_build.py checks the registers behind the blocks per SM).
TILE_COUNTS = (1, 2, 3, 4, 6, 8)


def token_tiles(M: int) -> int:
    t = -(-M // 8)
    return next(c for c in TILE_COUNTS if c >= t) if t <= TILE_COUNTS[-1] else TILE_COUNTS[-1]


def ring_steps(mt: int) -> int:
    return 3 if mt <= 2 or mt >= 5 else 2


def piece_steps(mt: int) -> int:
    return 3 if mt <= 2 else 2 if mt <= 4 else 1


def blocks_per_sm(mt: int, mode: int) -> int:
    return 2 if mt <= 3 or (mt == 4 and mode != MODE_PACKED) else 1


def scale_mode_of(dtype) -> Optional[int]:
    """The kernel's scale form for a weight_scale dtype, None when it is none of them."""
    if dtype == torch.float32:
        return MODE_F32
    if dtype == torch.uint8 or (hasattr(torch, "float8_e8m0fnu") and dtype == torch.float8_e8m0fnu):
        return MODE_UE8M0
    if dtype == torch.int32:
        return MODE_PACKED
    return None


def expected_scale_shape(mode: int, N: int, K: int, groups: Optional[int] = None) -> Tuple[int, ...]:
    kb = -(-K // STEP_K)
    shape = (N, -(-kb // 4)) if mode == MODE_PACKED else (-(-N // TILE_N), kb)
    return shape if groups is None else (groups,) + shape


def fp8_linear_supported(M: int, N: int, K: int, block_size=BLOCK_SIZE, scale_dtype=torch.float32, *,
                         groups: Optional[int] = None, x_stride: Optional[int] = None) -> Tuple[bool, str]:
    """(True, "") when the compiled kernel takes a call of this shape, else (False, why). Shape-only and cheap
    (the patch layer asks it per call to decide whether to hand the call back without raising): M tokens, N output
    rows, K inputs (per group for the grouped form), block_size (bn, bk), scale_dtype (float32, uint8 /
    float8_e8m0fnu, or int32 for DeepGEMM's packed UE8M0), groups (None: plain linear), x_stride (elements between
    token rows of x, when known). Tensor-level facts (devices, alignment of data pointers) are checked by the op."""
    bs = tuple(int(b) for b in block_size) if block_size is not None else None
    if bs != BLOCK_SIZE:
        return False, f"{OP}: block_size must be (128, 128), got {block_size}"
    if scale_mode_of(scale_dtype) is None:
        return False, (f"{OP}: weight_scale dtype must be float32, uint8 / float8_e8m0fnu (UE8M0) or int32 (DeepGEMM's "
                       f"packed UE8M0), got {scale_dtype}")
    if not 1 <= M <= MAX_M:
        return False, f"{OP}: M must be in [1, {MAX_M}] (decode sizes), got {M}"
    if N < 1:
        return False, f"{OP}: N must be >= 1, got {N}"
    if K < STEP_K or K % STEP_K:
        return False, f"{OP}: K must be a positive multiple of 128, got {K}"
    if groups is not None and not 1 <= groups <= 65535:
        return False, f"{OP}: groups must be in [1, 65535], got {groups}"
    if x_stride is not None and x_stride % 8:
        return False, f"{OP}: x rows must be 16-byte aligned (x stride % 8 == 0 elements), got stride {x_stride}"
    return True, ""


def pick_splits(M: int, N: int, K: int, groups: int, sms: int, mode: int = MODE_F32, kernel: str = "ring") -> int:
    """K splits of one call (grid = ceil(N / 128) tiles x splits x groups), from the shape and the SM count only.

    Cost model in step-times (one warp step streams 16 rows x 128 B; a block's 8 warps run side by side), per SM:
    ceil(blocks / SMs) x (steps per split + BLOCK_OVERHEAD_STEPS) / eff + (splits - 1) x M x PARTIAL_COST_PER_TOKEN,
    eff = min(1, resident blocks x bytes in flight per block / INFLIGHT_NEED_KB) (8 warps x (ring - 1) steps x 2 KB
    per block). The smallest cost wins, ties to fewer splits. At 132 SMs, M = 1, kernel "regs": wq_a 1024 x 4096 ->
    16 splits, wq_b 32768 x 1024 -> 1, wo_b 4096 x 8192 -> 8, wo_a 8 x 1024 x 4096 -> 4 (measured best on the H200
    but wo_b, not swept). Kernel "ring": one block per SM, (stages - 1) x 16 KB in flight, RING_BLOCK_OVERHEAD_STEPS
    per block (tests/test_fp8_linear.py pins both)."""
    forced = env_int(SPLITS_ENV, 1, MAX_SPLITS)
    steps = K // STEP_K
    top = max(1, min(steps, MAX_SPLITS))
    if forced is not None:
        return max(1, min(top, forced))
    mt = token_tiles(M)
    if kernel == "ring":
        occ, inflight_kb, overhead = 1, (ring_stages(mt) - 1) * 16.0, RING_BLOCK_OVERHEAD_STEPS
        partial = RING_PARTIAL_COST_PER_TOKEN
    else:
        occ, inflight_kb, overhead = blocks_per_sm(mt, mode), 8 * (ring_steps(mt) - 1) * 2.0, BLOCK_OVERHEAD_STEPS
        partial = PARTIAL_COST_PER_TOKEN
    tiles = -(-N // TILE_N) * groups
    best, best_cost = 1, None
    for s in range(1, top + 1):
        per_sm = -(-(tiles * s) // sms)
        eff = min(1.0, min(per_sm, occ) * inflight_kb / INFLIGHT_NEED_KB)
        cost = per_sm * (-(-steps // s) + overhead) / eff + (s - 1) * M * partial
        if best_cost is None or cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best
