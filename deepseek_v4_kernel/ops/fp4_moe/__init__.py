"""MXFP4 routed experts of DeepSeek-V4 (e2m1 weights, UE8M0 scales per 32 K values) without a dequantised copy.

Modules: ``api`` (``fp4_moe``: checks, routing, the launches), ``dispatch`` (which impl and tiles a call gets),
``kernels`` (the Triton kernels; the compiled decode kernels, two-launch and streaming, are csrc/fp4_moe). Design, evidence and switches:
docs/fp4_moe.md.
"""

from . import api, dispatch, kernels  # noqa: F401
from .api import fp4_moe  # noqa: F401
from .dispatch import (  # noqa: F401
    CUDA_DECODE_DEFAULT_SLOTS, CUDA_STREAM_DEFAULT_SLOTS, DECODE_GEMM2_TILE, DECODE_MAX_SLOTS, DEFAULT_IMPL_CC10,
    DEFAULT_IMPL_SM90, DEQUANT_DECODE_MAX_TRITON, GROUP, IMPL_ENV, IMPLS, LAST_KERNELS, MAX_SPLIT_K, OP,
    SMALL_ROUTE_MAX_SLOTS, SMEM_LIMIT, STREAM_MAX_EXPERTS, STREAM_MAX_SLOTS, decode_dequant_allowed, default_impl,
    k_per_split, max_row_blocks, pick_impl, regime, split_k, stream_items_bound, stream_plan, stream_wpi)
