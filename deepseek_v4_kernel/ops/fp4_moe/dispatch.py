"""Dispatch rules of the MXFP4 MoE: which implementation a call runs and with which tiles (shape-only, no device
work). Evidence for each rule: docs/fp4_moe.md.
"""
from __future__ import annotations

import torch
import triton

from deepseek_v4_kernel.ops._device import extension_error, triton_interpret, triton_version
from deepseek_v4_kernel.ops._stats import warn_once
from deepseek_v4_kernel.switches import env_choice

OP = "fp4_moe"
SMEM_LIMIT = 101376
GROUP = 32
IMPLS = ("dequant", "dot_scaled", "mxfp8", "cuda_decode", "cuda_stream")
IMPL_ENV = "DSV4_FP4_MOE_IMPL"   # forces one impl for every call
_IMPL_CODE = {"dequant": 0, "dot_scaled": 1, "mxfp8": 2}   # the Triton impls
# "cuda_decode": the compiled decode kernels (csrc/fp4_moe): at most DECODE_MAX_SLOTS = M * topk slots
# (DSV4_FP4_MOE_MAX_SLOTS in csrc/fp4_moe/params.h, checked at the C ABI); the default wherever it
# applies (_cuda_decode_unsupported) up to CUDA_DECODE_DEFAULT_SLOTS slots: on the H100 (H100,
# docs/fp4_moe.md) it beats "dequant" by 1.3-1.4x at 1 token, 1.1x at 8, ties at 32 tokens (192 slots)
# and is 1.4 % slower at 42 tokens.
DECODE_MAX_SLOTS = 256
CUDA_DECODE_DEFAULT_SLOTS = 192
# "cuda_stream": the same kernels' inner product on a persistent grid (csrc/fp4_moe/kernel_stream.cuh): at most
# STREAM_MAX_SLOTS slots and STREAM_MAX_EXPERTS experts (DSV4_FP4_MOE_STREAM_MAX_SLOTS / _EXPERTS, params.h, checked
# at the C ABI). The default up to CUDA_STREAM_DEFAULT_SLOTS slots (256 tokens at top-6), ahead of "cuda_decode":
# H200, I 2048, uint8 scales (tools/gpu_fp4_moe.sh): the best streaming variant 0.97-1.18x cuda_decode at 1-32
# tokens (cuda_decode stops at 192 slots) and 1.25-1.51x Triton's dequant (mma.sync) at 64-256 tokens.
STREAM_MAX_SLOTS = 2048
STREAM_MAX_EXPERTS = 1024
CUDA_STREAM_DEFAULT_SLOTS = 1536
# variant -> (weight steps in the ring, blocks of 128 threads per SM it is built for, weight source, MMA chains per
# m16 tile); csrc/fp4_moe/fp4_moe.cu, kernel_stream.cuh, kernel_stream_src.cuh. "regs": ld.global.nc into a register
# ring; "smem": cp.async into a shared-memory ring per warp (2560 B per step and warp: 62 / 52 KB per block with 4 / 3
# stages, so 3 / 4 blocks per SM on the H200 and 1 on SM120's 100 KB). H200, I 2048, uint8 scales: 36-48 % (v0),
# 35-53 % (v1), 30-56 % (v2-v5) of the weight floor at 1-256 tokens (docs/fp4_moe.md section 4).
STREAM_VARIANTS = {0: (3, 3, "regs", 1), 1: (2, 4, "regs", 1), 2: (4, 3, "smem", 1), 3: (3, 4, "smem", 1),
                   4: (3, 3, "regs", 2), 5: (3, 4, "smem", 2)}
# The default variant (stream_default_variant): the 4-block register ring (1) up to STREAM_SMALL_SLOTS slots, and the
# 4-block shared-memory ring with two MMA chains (5) above, where a GPU holds 4 of its 52 KB blocks per SM (the
# H100 / H200's 228 KB; SM120's 100 KB holds one, so it keeps variant 1). H200, I 2048, uint8 scales, 2026-12-02
# (tools/gpu_fp4_moe.sh), us (x variant 0): 2 / 4 tokens: v1 80.4 / 138.8 (1.07 / 1.15x); 8 tokens v1 293.6, v5
# 294.3 (a tie); 16 / 32 / 64 / 128 tokens: v5 471.2 / 793.3 / 1263.0 / 1644.8 (1.18 / 1.19 / 1.11 / 1.07x); 1 token:
# all within 3 % of variant 0 except the smem ones (0.84-0.88x). I 1024 alike. With float32 scales (what SGLang's
# Triton-runner method keeps) the register ring slows from 4 tokens on (v1 154.3 / 362.3 us at 4 / 8 tokens, +11 /
# +23 %) and v5 hardly (163.9 / 310.6, +5 %): so the boundary sits at 4 tokens (24 slots), where both forms agree.
STREAM_SMALL_SLOTS = 24
STREAM_SMEM_BIG_KB = 4 * 52
STREAM_DEFAULT_VARIANT = None   # None: stream_default_variant's rule; an int: that variant for every call


def stream_default_variant(S: int, smem_per_sm_kb: float = 0.0) -> int:
    """The variant the default dispatch runs for S slots on a GPU with ``smem_per_sm_kb`` of shared memory per SM."""
    if STREAM_DEFAULT_VARIANT is not None:
        return STREAM_DEFAULT_VARIANT
    if S <= STREAM_SMALL_SLOTS or smem_per_sm_kb < STREAM_SMEM_BIG_KB:
        return 1
    return 5
# Bench-only diagnostics (config={"stream": {"variant": v, "diag": name}}; wrong results by design, uint8 scales
# only): name -> (code or-ed into the variant, the variants it exists for). "loads": the weight stream with the
# decode + MMA replaced by an XOR fold (the memory-side ceiling of that variant's load scheme); "compute": decode +
# MMA on weights loaded once (the compute-side ceiling). params.h DSV4_FP4_MOE_DIAG_*.
STREAM_DIAGS = {"loads": (16, (0, 1, 3)), "compute": (32, (0, 1))}
# warps per work item (stream_wpi): the fewest (1, 2, 4) that still give every warp of the grid >= STREAM_BALANCE
# items on average (balance across warps; fewer warps per item = fewer shared-memory partial sums and barriers)
STREAM_BALANCE = 2.0
STREAM_GEMM1_ROWS, STREAM_GEMM2_ROWS, STREAM_STEP_K = 16, 32, 128
DECODE_GEMM2_TILE = 32   # DSV4_FP4_MOE_GEMM2_TILE: output columns per gemm2 block, one counter each
# default impl per regime ("decode" / "mid" / "prefill", see regime()); sm90 from the H100 runs
DEFAULT_IMPL_SM90 = {"decode": "dequant", "mid": "dot_scaled", "prefill": "dot_scaled"}
# cc >= 10: decode is weight-bandwidth bound, so the exact path costs nothing there; mid and
# prefill use the one variant Triton lowers to SM120's native block-scaled MMA (MXFP8 activations,
# the precision class of SGLang's own SM120 FlashInfer path and of DeepGEMM's FP8 x FP4 GEMMs).
DEFAULT_IMPL_CC10 = {"decode": "dequant", "mid": "mxfp8", "prefill": "mxfp8"}
# The decode regime's "dequant" holds up to this Triton version. H100 (docs/fp4_moe.md), mma.sync builds
# (DISABLE_MMA_V3=1, SM120's instruction class), DeepSeek-V4's experts: triton 3.8.0 (SGLang 0.5.23's) passes the
# dequantised bf16 weight tiles and the activation halves to the MMA through shared memory (sm_120a build: 196
# registers instead of 119, 20480 B of shared memory instead of 13312), and "dequant" took 1.22-1.73x its triton
# 3.6.0 time at 64-256 tokens (64: 1657 -> 2868 us), 1.39-1.42x "dot_scaled"'s, whose build did not change (64: 2035
# us under both). So under a newer Triton the decode regime runs "dot_scaled" (exact as well). H100, triton 3.9.0
# (torch 2.15.0's pin): "dequant" is built as under 3.6.0 again (sm_120a: 128 registers, 13312 B), but "dot_scaled"
# got faster (0.71-0.74x its 3.6.0 time at 64-256 tokens) and stays ahead ("dequant" takes 1.29-1.30x its time), so
# the rule holds for 3.9 too.
DEQUANT_DECODE_MAX_TRITON = (3, 6)
SMALL_ROUTE_MAX_SLOTS = 512

# compiled kernels of the last call (for the shared-memory test)
LAST_KERNELS: dict = {}


def _interp() -> bool:
    return triton_interpret()   # TRITON_INTERPRET as Triton reads it ("true" too, not only "1")


# --------------------------------------------------------------------------- configs
_CFG_KEYS = ("BM", "BN", "BK", "GROUP_M", "num_warps", "num_stages", "SPLIT_K")
# Split-K of gemm1 (grid axis 1) when it has too few programs to hide the weight stream's latency:
# at 1 token only 6 experts are hit, 384 programs of 2 warps, ~6 warps per H100 SM (H100 profile:
# gemm1 50 us = 34 % of its byte floor, vs 51 % at 8 tokens; 41 us with the split). The split
# doubles until the grid reaches SPLIT_PROGRAMS_PER_SM programs per SM, keeping >= 2 K steps per
# split (shapes only). gemm2 splits only when a config asks (see fp4_moe()).
SPLIT_PROGRAMS_PER_SM = 8
MAX_SPLIT_K = 8


# Tiles per impl and regime (H100 sweeps, docs/fp4_moe.md): BM rows (tokens) per block,
# shared by both GEMMs (it sets the row layout); BN weight rows per program (gemm1: per gate
# and per up half); BK K per step. "decode" = <= 8 expected rows per expert (weight-stream
# bound: many small programs over N), "mid" <= 48, "prefill" above.
_CONFIGS = {
    "dequant": {
        "decode": (dict(BM=16, BN=32, BK=128, GROUP_M=1, num_warps=2, num_stages=4),
                   dict(BM=16, BN=32, BK=128, GROUP_M=1, num_warps=2, num_stages=4)),
        "mid": (dict(BM=32, BN=128, BK=64, GROUP_M=4, num_warps=4, num_stages=4),
                dict(BM=32, BN=128, BK=64, GROUP_M=4, num_warps=4, num_stages=4)),
        "prefill": (dict(BM=128, BN=128, BK=64, GROUP_M=8, num_warps=8, num_stages=3),
                    dict(BM=128, BN=128, BK=64, GROUP_M=8, num_warps=8, num_stages=3)),
    },
    "dot_scaled": {
        "decode": (dict(BM=16, BN=32, BK=128, GROUP_M=1, num_warps=2, num_stages=4),
                   dict(BM=16, BN=32, BK=128, GROUP_M=1, num_warps=2, num_stages=4)),
        "mid": (dict(BM=32, BN=64, BK=128, GROUP_M=4, num_warps=4, num_stages=3),
                dict(BM=32, BN=64, BK=128, GROUP_M=4, num_warps=4, num_stages=3)),
        "prefill": (dict(BM=128, BN=64, BK=64, GROUP_M=8, num_warps=4, num_stages=4),
                    dict(BM=128, BN=64, BK=64, GROUP_M=8, num_warps=4, num_stages=4)),
    },
    "mxfp8": {
        "decode": (dict(BM=16, BN=32, BK=256, GROUP_M=1, num_warps=4, num_stages=3),
                   dict(BM=16, BN=32, BK=256, GROUP_M=1, num_warps=4, num_stages=3)),
        "mid": (dict(BM=32, BN=64, BK=128, GROUP_M=4, num_warps=4, num_stages=3),
                dict(BM=32, BN=64, BK=128, GROUP_M=4, num_warps=4, num_stages=3)),
        "prefill": (dict(BM=64, BN=64, BK=64, GROUP_M=8, num_warps=4, num_stages=4),
                    dict(BM=64, BN=64, BK=64, GROUP_M=8, num_warps=4, num_stages=4)),
    },
}


def regime(M: int, topk: int, E: int) -> str:
    S = M * topk
    per_expert = S / max(1, min(E, S))
    return "decode" if per_expert <= 8 else ("mid" if per_expert <= 48 else "prefill")


def split_k(programs: int, K: int, BK: int, num_sms: int) -> int:
    """K splits for a GEMM grid of `programs` programs over K (see SPLIT_PROGRAMS_PER_SM)."""
    sk = 1
    while (sk < MAX_SPLIT_K and programs * sk < SPLIT_PROGRAMS_PER_SM * num_sms
           and triton.cdiv(K, 2 * sk * BK) >= 2):
        sk *= 2
    return sk


def max_row_blocks(S: int, BM: int, E: int) -> int:
    """Upper bound on the BM-row blocks of S slots over E experts, for any routing."""
    return S // BM + min(E, S)


def k_per_split(K: int, BK: int, splits: int) -> int:
    """K range of one split: whole BK steps (a step never straddles two splits; surplus splits
    get none)."""
    return triton.cdiv(triton.cdiv(K, BK), splits) * BK


def _pick_config(M: int, topk: int, E: int, I: int, H: int, impl: str):
    c1, c2 = _CONFIGS[impl][regime(M, topk, E)]
    return dict(c1), dict(c2)


def _finish_config(c1, c2, I, H):
    c2["BM"] = c1["BM"]  # both GEMMs share the row layout
    # tiny problems: keep BK <= K rounded up to a power of two >= 32
    c1["BK"] = min(c1["BK"], max(32, triton.next_power_of_2(H)))
    c2["BK"] = min(c2["BK"], max(32, triton.next_power_of_2(I)))
    return c1, c2


def _compiled_layout_unsupported(x, w13, w2, H, inter):
    """Why the compiled decode kernels' layout rules reject these tensors (None when they take them): hidden and I
    multiples of 128 (whole K steps), 16-byte aligned rows of x, w13 and w2 (their 16-byte loads)."""
    if H % 128 or inter % 128:
        return f"hidden ({H}) and I ({inter}) must be multiples of 128"
    if x.stride(0) % 8 or x.data_ptr() % 16:
        return f"hidden_states rows must be 16-byte aligned (stride(0) {x.stride(0)}, data_ptr % 16 {x.data_ptr() % 16})"
    for name, w in (("w13", w13), ("w2", w2)):
        if w.stride(1) % 16 or w.data_ptr() % 16:
            return f"{name} rows must be 16-byte aligned (strides {w.stride()})"
    return None


def _cuda_decode_unsupported(x, w13, w2, S, H, inter):
    """Why the compiled decode kernels cannot take this call (None when they can)."""
    if _interp() or x.device.type != "cuda":
        return "needs a CUDA device"
    if S > DECODE_MAX_SLOTS:
        return f"M * topk = {S} slots > {DECODE_MAX_SLOTS}"
    why = _compiled_layout_unsupported(x, w13, w2, H, inter)
    if why is not None:
        return why
    from deepseek_v4_kernel._ext import has_fp4_moe_decode
    if not has_fp4_moe_decode():
        return "the CUDA extension (_C.so with the fp4_moe kernels) does not load"
    return extension_error(x.device)


def stream_items_bound(S: int, E: int, tiles: int) -> int:
    """Most work items one streaming kernel can have for any routing of S slots over E experts: passes (an expert's
    slots in groups of 8) <= min(E, S) + S // 8, times the row tiles."""
    return (min(E, S) + S // 8) * tiles


def stream_wpi(items: int, nsteps: int, total_warps: int, balance: float = STREAM_BALANCE) -> int:
    """Warps per work item: the fewest of 1, 2, 4 with items * wpi >= balance * total_warps (else 4), at most the K
    steps (as the kernel clamps it: every warp of a group gets a step)."""
    w = 4
    for cand in (1, 2, 4):
        if items * cand >= balance * total_warps:
            w = cand
            break
    while w > 1 and w > nsteps:
        w //= 2
    return w


def stream_plan(M: int, topk: int, E: int, H: int, I: int, num_sms: int, overrides=None,
                smem_per_sm_kb: float = 0.0) -> dict:
    """Launch choices of "cuda_stream" for a call (shapes only): variant, warps per item of each GEMM (wpi1 / wpi2)
    and the grid cap per SM (blocks_per_sm, 0 = the occupancy). ``overrides`` (config={"stream": {...}}) replaces
    any of them, and may name a bench-only diagnostic ("diag": STREAM_DIAGS; then in the plan too)."""
    over = dict(overrides or {})
    bad = set(over) - {"variant", "wpi1", "wpi2", "blocks_per_sm", "balance", "diag"}
    if bad:
        raise ValueError(f"stream config keys must be among variant, wpi1, wpi2, blocks_per_sm, balance, diag; "
                         f"got {sorted(bad)}")
    variant = over.get("variant", stream_default_variant(M * topk, smem_per_sm_kb))
    if variant not in STREAM_VARIANTS:
        raise ValueError(f"stream variant must be one of {sorted(STREAM_VARIANTS)}, got {variant!r}")
    diag = over.get("diag")
    if diag is not None and (diag not in STREAM_DIAGS or variant not in STREAM_DIAGS[diag][1]):
        raise ValueError(f"stream diag must be one of {sorted(STREAM_DIAGS)} with a variant it exists for "
                         f"({ {k: list(v[1]) for k, v in STREAM_DIAGS.items()} }), got {diag!r} with variant {variant}")
    bps = over.get("blocks_per_sm", 0)
    if not isinstance(bps, int) or bps < 0:
        raise ValueError(f"stream blocks_per_sm must be an int >= 0, got {bps!r}")
    balance = float(over.get("balance", STREAM_BALANCE))
    per_sm = STREAM_VARIANTS[variant][1] if bps == 0 else min(bps, STREAM_VARIANTS[variant][1])
    warps = max(1, num_sms) * per_sm * 4
    S = M * topk
    plan = {"variant": variant, "blocks_per_sm": bps,
            "wpi1": stream_wpi(stream_items_bound(S, E, I // STREAM_GEMM1_ROWS), H // STREAM_STEP_K, warps, balance),
            "wpi2": stream_wpi(stream_items_bound(S, E, H // STREAM_GEMM2_ROWS), I // STREAM_STEP_K, warps, balance)}
    if diag is not None:
        plan["diag"] = diag
    for k in ("wpi1", "wpi2"):
        if k in over:
            if over[k] not in (1, 2, 4):
                raise ValueError(f"stream {k} must be 1, 2 or 4, got {over[k]!r}")
            plan[k] = over[k]
    return plan


def _cuda_stream_unsupported(x, w13, w2, S, H, inter):
    """Why the streaming decode kernels cannot take this call (None when they can)."""
    if _interp() or x.device.type != "cuda":
        return "needs a CUDA device"
    if S > STREAM_MAX_SLOTS:
        return f"M * topk = {S} slots > {STREAM_MAX_SLOTS}"
    if w13.shape[0] > STREAM_MAX_EXPERTS:
        return f"E = {w13.shape[0]} experts > {STREAM_MAX_EXPERTS}"
    why = _compiled_layout_unsupported(x, w13, w2, H, inter)
    if why is not None:
        return why
    from deepseek_v4_kernel._ext import has_fp4_moe_stream
    if not has_fp4_moe_stream():
        return "the CUDA extension (_C.so with the fp4_moe streaming kernels) does not load"
    return extension_error(x.device)


def pick_impl(hidden_states, w13, w2, topk: int, config=None) -> str:
    """The impl fp4_moe(impl=None) runs: env DSV4_FP4_MOE_IMPL; else "cuda_stream" when config has a "stream"
    entry; else (no config) the streaming decode kernels up to CUDA_STREAM_DEFAULT_SLOTS slots where they apply,
    then the two-launch decode kernels up to CUDA_DECODE_DEFAULT_SLOTS; else the Triton default of the regime
    (default_impl)."""
    M, H = hidden_states.shape
    E, inter = w13.shape[0], w13.shape[1] // 2
    S = M * topk
    if env_choice(IMPL_ENV, IMPLS) is None and isinstance(config, dict) and "stream" in config:
        return "cuda_stream"
    if env_choice(IMPL_ENV, IMPLS) is None and config is None and 0 < S <= CUDA_STREAM_DEFAULT_SLOTS:
        why = _cuda_stream_unsupported(hidden_states, w13, w2, S, H, inter)
        if why is None:
            return "cuda_stream"
        if S <= CUDA_DECODE_DEFAULT_SLOTS and _cuda_decode_unsupported(hidden_states, w13, w2, S, H, inter) is None:
            return "cuda_decode"
        fallback = default_impl(regime(M, topk, E), hidden_states.device)
        if not _interp():   # (under the interpreter, on the CPU, Triton is the only choice: nothing to say)
            warn_once(OP, f"the compiled decode kernels cannot take a call of {S} slots ({why}): it runs the Triton "
                          f"impl {fallback!r}, slower at decode sizes")
        return fallback
    return default_impl(regime(M, topk, E), hidden_states.device)


def default_impl(regime_name: str = "decode", device=None) -> str:
    env = env_choice(IMPL_ENV, IMPLS)
    if env:
        return env
    if _interp() or not torch.cuda.is_available():
        return "dequant"
    if device is not None and torch.device(device).type != "cuda":
        return "dequant"
    major = torch.cuda.get_device_capability(device)[0]
    impl = (DEFAULT_IMPL_CC10 if major >= 10 else DEFAULT_IMPL_SM90)[regime_name]
    if impl == "dequant" and not decode_dequant_allowed():
        return "dot_scaled"
    return impl


def decode_dequant_allowed() -> bool:
    """Whether the decode regime's "dequant" default holds under the installed Triton (DEQUANT_DECODE_MAX_TRITON)."""
    return triton_version() <= DEQUANT_DECODE_MAX_TRITON


