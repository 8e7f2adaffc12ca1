"""``python -m deepseek_v4_kernel bench``: our ops against every SGLang path installed here, on this GPU.

Modules: ``cli`` (arguments, the run), ``shapes`` (DeepSeek-V4 shapes per op, size class and TP size), ``inputs``
(rotated input sets from our reference packers, the float64 checks), ``runner`` (check, then time, each kernel),
``report`` (the JSON DSV4_KERNEL_PREFER=measured reads, and the table), ``timing`` (CUDA-graph timing and floors,
shared with benchmarks/), ``sources`` (SGLang's kernels loaded from its files, SGLang itself not imported).
Competitors: ``competitors`` (a provider list per op; it imports SGLang's SM120 dispatcher for FlashInfer's path, on
SM120 only); ``moe_competitors`` (SGLang's Marlin MXFP4 MoE runner and FlashInfer's flashinfer_mxfp4 paths through
SGLang's own weight preparation and call; it imports SGLang; also used by benchmarks/bench_fp4_moe.py).
"""
