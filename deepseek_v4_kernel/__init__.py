"""DeepSeek-V4 (Flash) kernels for SM120 GPUs, patched into an unmodified SGLang.

Importing this package is cheap: it imports neither torch nor SGLang. The ops live in
``deepseek_v4_kernel.ops`` (each imports torch/triton when first used) and the patch
layer in ``deepseek_v4_kernel.patch``.
"""

__version__ = "0.1.0"
