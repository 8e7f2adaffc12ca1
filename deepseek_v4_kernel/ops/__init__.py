"""One module per op; each exposes a thin function with checks up front.

sparse_decode   - FlashMLA sparse FP8 decode (compiled extension)
indexer_logits  - DeepGEMM fp8_paged_mqa_logits / fp8_mqa_logits (Triton)
hc_prenorm      - DeepGEMM tf32_hc_prenorm_gemm (Triton)
fp4_moe         - MXFP4 routed experts (Triton)
"""
