"""Block-scaled FP8 linear at decode sizes (M <= 64): y = x W^T with W e4m3 + 128 x 128 block scales, x bf16
(never quantized), bf16 out; and its grouped form (DeepSeek-V4's wo_a). See docs/fp8_linear.md."""
from .api import fp8_grouped_linear, fp8_linear
from .dispatch import MAX_M, fp8_linear_supported, pick_splits

__all__ = ["fp8_linear", "fp8_grouped_linear", "fp8_linear_supported", "pick_splits", "MAX_M"]
