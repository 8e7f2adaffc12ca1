"""``python -m deepseek_v4_kernel bench``: our ops against every SGLang path installed here, on this GPU.

Modules: ``cli`` (arguments, the run), ``shapes`` (DeepSeek-V4 shapes per op, size class and TP size), ``inputs``
(rotated input sets from our reference packers, the float64 checks), ``runner`` (check, then time, each kernel),
``report`` (the JSON DSV4_KERNEL_PREFER=measured reads, and the table), ``timing`` (CUDA-graph timing and floors,
shared with benchmarks/), ``sources`` (SGLang's kernels loaded from its files, SGLang itself not imported).
Competitors: bench/competitors.py (which imports SGLang's SM120 dispatcher for FlashInfer's path, on SM120 only).
"""
