"""mHC pre-norm GEMM: DeepGEMM's ``tf32_hc_prenorm_gemm`` for GPUs DeepGEMM does not serve (SM120).

    out[s, i, j] = sum_{k in slice s} x[i, k] * fn[j, k]      sqrsum[s, i] = sum_{k in slice s} x[i, k] ** 2

Modules: ``api`` (checks, buffers, launches: ``hc_prenorm_gemm``, DeepGEMM's ``tf32_hc_prenorm_gemm``), ``dispatch``
(which kernel and launch shape a call gets), ``kernels`` (the Triton kernels; the compiled ones are csrc/hc_prenorm).
Design, dispatch evidence and switches: docs/hc_prenorm.md.
"""

from . import api, dispatch, kernels  # noqa: F401
from .api import compiled_smem, hc_prenorm_gemm, tf32_hc_prenorm_gemm  # noqa: F401
from .dispatch import (  # noqa: F401
    ATOMIC_ENV, CUDA_MIN_M, CUDA_MIN_M_SPLIT, DETERMINISTIC_SOURCES, FNROW_AUTO_MAX_M, FNROW_MAX_M, IMPLS, MAX_N,
    MMA_ROWS, MMA_ROWS_NONE_MAX_M, MMA_ROWS_SPLIT_MAX_M, OP, PRESPLIT_WGMMA_MAX_TRITON, SMALL_MAX_M, SMALL_MAX_SPLIT_K,
    SMALL_SUB_MAX_M, SMEM_LIMIT, XCHG_AUTO_MAX_M, XCHG_MAX_M, atomic_applies, atomic_enabled, auto_prefers_cuda,
    choose_config, cuda_sub_splits, cuda_unsupported, decode_rows, deterministic_sums, exchange_enabled, fnrow_applies,
    fnrow_enabled, legacy_config, mma_kind, mma_rows_pick, mma_rows_sub_splits, pick_impl, presplit_allowed,
    small_applies, small_rows, small_sub_splits)
