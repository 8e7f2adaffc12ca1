"""DeepSeek-V4-Flash's dense block-FP8 projections per tensor-parallel rank (N x K of each rank's weight), read off
SGLang 0.5.23's ``models/deepseek_v4.py`` (MqaAttentionBase.__init__), ``layers/attention/dsv4/indexer.py``
(C4Indexer) and ``models/deepseek_v2.py`` (DeepseekV2MLP as the shared expert), with DeepSeekV4Config's widths
(hidden 4096, q_lora_rank 1024, 64 heads x head_dim 512, o_groups 8, o_lora_rank 1024, indexer 64 x 128, shared
expert intermediate 2048). Column-parallel layers split N by TP, row-parallel ones K; replicated ones neither.
Not FP8 (bf16 in the checkpoint as SGLang builds them: quant_config None): the compressors' wkv_gate and the
indexer's weights_proj. Plain data, no engine import."""
from __future__ import annotations

from typing import List, NamedTuple, Optional

TP_SIZES = (1, 2, 4, 8)


class Shape(NamedTuple):
    name: str
    N: int
    K: int
    groups: Optional[int] = None   # the grouped form (wo_a): groups per rank
    note: str = ""

    @property
    def weight_bytes(self) -> int:
        return (self.groups or 1) * self.N * self.K


def model_shapes(tp: int = 1) -> List[Shape]:
    """Every dense FP8 projection of one DeepSeek-V4-Flash layer as one rank of a TP-``tp`` group runs it."""
    if tp not in TP_SIZES:
        raise ValueError(f"tp must be one of {TP_SIZES}, got {tp}")
    return [
        Shape("wq_a", 1024, 4096, note="ReplicatedLinear hidden -> q_lora_rank"),
        Shape("wkv", 512, 4096, note="ReplicatedLinear hidden -> head_dim"),
        Shape("wqkv_a", 1536, 4096, note="wq_a and wkv fused into one projection (an engine option)"),
        Shape("wq_b", 32768 // tp, 1024, note="ColumnParallelLinear q_lora_rank -> heads x head_dim"),
        Shape("wo_a", 1024, 4096, groups=8 // tp, note="grouped: deep_gemm.fp8_einsum bhr,hdr->bhd, G = 8 / tp"),
        Shape("wo_b", 4096, 8192 // tp, note="RowParallelLinear o_groups x o_lora_rank -> hidden"),
        Shape("indexer.wq_b", 8192, 1024, note="ReplicatedLinear q_lora_rank -> 64 x 128 (C4 layers)"),
        Shape("shared.gate_up", 4096 // tp, 4096, note="MergedColumnParallelLinear hidden -> 2 x 2048"),
        Shape("shared.down", 4096, 2048 // tp, note="RowParallelLinear 2048 -> hidden"),
    ]
