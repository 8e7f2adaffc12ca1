"""The target table: every place the patch layer touches, as data.

Each row says which (module, attribute) to replace (or which gate to set), with what, for
which SGLang versions, under which condition, and which keyword names the SGLang call site
passes (checked against both the original and our replacement before patching).

Evidence for each row (file:line in the SGLang wheels) is in docs/sglang_surface.md;
tests/test_patch_targets.py checks every row against the real wheels.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from . import measured, policy

# SGLang releases surveyed (docs/sglang_surface.md). 0.5.12 is the first with DeepSeek-V4.
SURVEYED = ("0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1",
            "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
# Versions whose wheels the test-suite installs and patches for real: oldest, middle, newest, and 0.5.20 (the last
# whose fused post/pre step imports deep_gemm behind the hc_prenorm flag alone, with direct flag reads).
TESTED = ("0.5.12", "0.5.17", "0.5.20", "0.5.23")


@dataclass(frozen=True)
class Target:
    op: str  # which of our ops this serves
    module: str  # module that owns the attribute (for kind "env": unused, "")
    attr: str  # attribute to replace / set; for kind "env": the variable name
    replacement: str = ""  # "package.module:function" (kind "replace")
    first: str = "0.5.12"  # first SGLang version with this call site
    last: Optional[str] = None  # last one; None = still there in the newest surveyed (newer ones are tried, checked)
    params: Tuple[str, ...] = ()  # keywords the SGLang call site passes: original and ours must accept them
    when: Optional[str] = None  # name of a CONDITIONS entry; None = always needed on SM12x
    importers: Tuple[str, ...] = ()  # modules that `from module import attr` at their import time
    callers: Tuple[str, ...] = ()  # SGLang modules whose source calls attr (tests read their keywords)
    kind: str = "replace"  # "replace" | "setattr" (module.attr = value) | "env" (environment default)
    value: Any = None
    # kind "env": SGLang's launcher may change the variable after start-up (0.5.13-0.5.19 force one off on SM120):
    # a process started later that finds another value where this layer had set it (the user had not) sets it again
    reassert: bool = False
    note: str = ""

    def version_text(self) -> str:
        return f"{self.first}..{self.last or ''}"

    def applies_to_version(self, version: Optional[str]) -> Tuple[bool, str]:
        if version is None:
            return False, "SGLang is not installed"
        v = policy.parse_version(version)
        if not v:
            return False, f"cannot parse SGLang version {version!r}"
        if v < policy.parse_version(self.first):
            return False, f"SGLang {version} predates this call site (first in {self.first})"
        if self.last is not None and v > policy.parse_version(self.last):
            return False, f"SGLang {version} no longer has this call site (last in {self.last})"
        return True, "in range"


# ----------------------------------------------------------------------------- conditions
# Each takes the imported module and returns (needed, why). Evaluated when the module is
# imported, so it sees the module's real state. A condition of an "env" row is evaluated when
# the patch layer installs (at the first import of SGLang, before its code runs) and takes the SGLang version instead.

def _flashinfer_has_sm120_sparse_mla() -> bool:
    """FlashInfer's native SM120 sparse-MLA module exists (checked on disk: importing
    flashinfer here would be slow and could initialise CUDA)."""
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(os.path.exists(os.path.join(p, "mla", "_sparse_mla_sm120.py")) for p in spec.submodule_search_locations)


def sm120_sparse_decode_not_native(module) -> Tuple[bool, str]:
    """SGLang >= 0.5.13 has its own SM120 dispatcher; replace it unless it would run FlashInfer's native kernel."""
    backend = getattr(module, "_sm120_default_backend", None)
    if policy.prefer_ours():
        return True, f"{policy.PREFER}=ours (SGLang backend was {backend!r})"
    if measured.prefer_measured():   # measured dispatch decides per call and class, FlashInfer's kernel included
        return True, f"measured dispatch decides per size class (SGLang backend was {backend!r})"
    if backend in ("triton", "torch"):
        return True, f"SGLang would run its slow {backend} fallback"
    if backend == "flashinfer":
        if _flashinfer_has_sm120_sparse_mla():
            return False, (f"SGLang runs FlashInfer's native SM120 sparse MLA kernel; "
                           f"set {policy.PREFER}=ours to use ours")
        return True, "SGLang's default FlashInfer backend lacks flashinfer.mla._sparse_mla_sm120"
    return True, f"unknown SGLang SM120 backend {backend!r}"


SM120_DISPATCHER = "sglang.kernels.ops.attention.flash_mla_sm120"   # 0.5.16+ (its row below reads it too)
UNPADDED_HEADS_ENV = "DSV4_SPARSE_DECODE_UNPADDED_HEADS"           # "0": leave SGLang's decode q padding as it is


def sm120_sparse_decode_is_ours(module) -> Tuple[bool, str]:
    """SGLang's SM120 sparse decode is ours (row above patched), which takes the rank's own head count."""
    # Evaluated when sglang.srt.models.deepseek_v4 is imported; it imports the dispatcher's module at its top
    # (0.5.20 deepseek_v4.py:32, 0.5.23 :38), so that module's row has been decided by then.
    from ..switches import InvalidSwitch, env_bool

    try:
        unpadded = env_bool(UNPADDED_HEADS_ENV, True)
    except InvalidSwitch as e:   # (a value we do not read: SGLang's own way, and the reason said)
        return False, f"{e}: SGLang's 64-head pad kept"
    if not unpadded:
        return False, f"{UNPADDED_HEADS_ENV}=0: SGLang's 64-head pad kept"
    dispatcher = getattr(sys.modules.get(SM120_DISPATCHER), "flash_mla_with_kvcache_sm120", None)
    if getattr(dispatcher, "__dsv4_target__", None) is None:
        return False, ("SGLang's own SM120 sparse decode runs (FlashInfer's native kernel takes the rank's heads "
                       "itself; the other paths were written for the 64-head pad)")
    return True, "SGLang's SM120 sparse decode is ours, which takes any head count: decode q is not padded to 64"


def hc_prenorm_gate_cannot_reach_a_missing_deep_gemm(version) -> Tuple[bool, str]:
    """SGLang 0.5.13-0.5.16 or >= 0.5.21, or an importable deep_gemm (0.5.17-0.5.20 import it behind the flag alone)."""
    # Where the flag leads on SM120 (docs/sglang_surface.md, hc_prenorm): hc_pre's DeepGEMM branch and mhc_pre call the
    # entrypoint (ours, no deep_gemm needed); the fused post/pre step does `import deep_gemm` behind the flag
    # alone in 0.5.17-0.5.20 (0.5.17 mhc.py:1448, 0.5.20 mhc.py:1646), where SM120 can take that step (0.5.17 with
    # SGLANG_OPT_FUSE_MHC_POST_PRE=1, 0.5.18+ by default); 0.5.13-0.5.16 take it only with the TileLang pre
    # path, which they force off on SM120; 0.5.21+ ask mhc._use_deep_gemm_hc_prenorm first (replaced: it checks
    # that deep_gemm is importable).
    v = policy.parse_version(version) if version else ()
    if v and (v < policy.parse_version("0.5.17") or v >= policy.parse_version("0.5.21")):
        return True, f"no SGLang {version} caller on SM120 imports deep_gemm behind this flag alone"
    if importlib.util.find_spec("deep_gemm") is not None:
        return True, "deep_gemm is importable (its prenorm GEMM is replaced when it is imported)"
    return False, (f"SGLang {version}'s fused post/pre step would `import deep_gemm` behind this flag and no "
                   f"deep_gemm is installed: flag left unset (SGLang's own path runs)")


FP8_WO_A_ENV = "SGLANG_OPT_FP8_WO_A_GEMM"


def fp8_wo_a_path_takes_ours(version) -> Tuple[bool, str]:
    """SGLang 0.5.16-0.5.23 (an fp32-scale FP8 wo_a path), with a deep_gemm to import where its forward imports one."""
    # 0.5.12-0.5.15: the weight scales always go through DeepGEMM's transform_sf_into_required_layout and the GEMM
    # takes recipe (1, 1, 128) (UE8M0, SM100 only): nothing else can serve it (0.5.12 deepseek_v4.py:588-604,
    # 1138-1160). 0.5.16-0.5.22: the forward does `import deep_gemm` before the GEMM (0.5.17 :1321), whose
    # fp8_einsum is then ours (deep_gemm row); 0.5.23 calls its own wrapper, ours (no deep_gemm needed).
    v = policy.parse_version(version) if version else ()
    if not v or v < policy.parse_version("0.5.16"):
        return False, (f"SGLang {version}'s FP8 wo_a path needs DeepGEMM's SM100 UE8M0 scale layout (no fp32-scale "
                       f"branch): wo_a stays bf16 (dequantized at load)")
    if v < policy.parse_version("0.5.23") and importlib.util.find_spec("deep_gemm") is None:
        return False, (f"SGLang {version}'s FP8 wo_a forward does `import deep_gemm` and no deep_gemm is installed: "
                       f"wo_a stays bf16 (dequantized at load)")
    return True, "FP8 wo_a on: its grouped GEMM is ours, the weight stays FP8"


def fp8_wo_a_gemm_on(module) -> Tuple[bool, str]:
    """SGLang's FP8 wo_a path is on in this process (SGLANG_OPT_FP8_WO_A_GEMM, read when deepseek_v4 is imported)."""
    on = getattr(module, "_FP8_WO_A_GEMM", None)
    if on is not True:
        return False, f"{FP8_WO_A_ENV} is off here ({module.__name__}._FP8_WO_A_GEMM = {on!r}): wo_a is bf16"
    return True, f"{FP8_WO_A_ENV} is on"

def measured_dispatch_on(module) -> Tuple[bool, str]:
    """Measured dispatch (the default): each worker decides per op and size class after its model loads."""
    if not measured.prefer_measured():
        return False, f"{policy.PREFER}={policy.prefer_mode()}: nothing timed at start-up"
    if measured.bench_file_decides():
        return False, f"the user's bench file decides ({measured.load().why})"
    return True, "each worker decides after its model loads (read from the cache, or timed at the first start)"


def moe_runner_chosen_at_start_up(module) -> Tuple[bool, str]:
    """Where SGLang would pick FlashInfer's MXFP4 MoE runner itself (`auto`), ours if measured faster on this GPU."""
    if policy.prefer_mode() == "builtin":
        return False, f"{policy.PREFER}=builtin: SGLang's own choice of MoE runner stands"
    return True, "SGLang's `auto` choice of flashinfer_mxfp4 is checked against the measurement"


CONDITIONS: Dict[str, Callable[[Any], Tuple[bool, str]]] = {
    "measured_dispatch_on": measured_dispatch_on,
    "moe_runner_chosen_at_start_up": moe_runner_chosen_at_start_up,
    "sm120_sparse_decode_not_native": sm120_sparse_decode_not_native,
    "hc_prenorm_gate_cannot_reach_a_missing_deep_gemm": hc_prenorm_gate_cannot_reach_a_missing_deep_gemm,
    "sm120_sparse_decode_is_ours": sm120_sparse_decode_is_ours,
    "fp8_wo_a_path_takes_ours": fp8_wo_a_path_takes_ours,
    "fp8_wo_a_gemm_on": fp8_wo_a_gemm_on,
}

# ----------------------------------------------------------------------------- the table
_SPARSE_DECODE_KWARGS = (
    "q", "k_cache", "head_dim_v", "softmax_scale", "indices", "topk_length", "attn_sink",
    "extra_k_cache", "extra_indices_in_kvcache", "extra_topk_length",
)

_INDEXER_PARAMS = ("q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table", "deep_gemm_metadata",
                   "max_seq_len", "clean_logits")  # callers pass them positionally, in this order

TARGETS: Tuple[Target, ...] = (
    # --- sparse decode ------------------------------------------------------------------
    # 0.5.12: DeepseekV4 backend calls flash_mla.flash_mla_with_kvcache (the FlashMLA wheel),
    # which has no SM120 kernel ("Unsupported architecture for sparse decode fwd").
    Target(
        op="sparse_decode", module="flash_mla.flash_mla_interface", attr="flash_mla_with_kvcache",
        replacement="deepseek_v4_kernel.patch.adapters:flash_mla_with_kvcache",
        first="0.5.12", last="0.5.12.post1",
        params=_SPARSE_DECODE_KWARGS + ("block_table", "cache_seqlens", "tile_scheduler_metadata", "is_fp8_kvcache"),
        importers=("flash_mla",), callers=("sglang.srt.layers.attention.deepseek_v4_backend",),
        note="deepseek_v4_backend.py: `import flash_mla; flash_mla.flash_mla_with_kvcache(...)` at call time",
    ),
    # 0.5.13-0.5.15.post1: SGLang's SM120 dispatcher in sglang.srt.layers.attention (Triton by default).
    Target(
        op="sparse_decode", module="sglang.srt.layers.attention.flash_mla_sm120", attr="flash_mla_with_kvcache_sm120",
        replacement="deepseek_v4_kernel.patch.adapters:flash_mla_with_kvcache_sm120",
        first="0.5.13", last="0.5.15.post1", params=_SPARSE_DECODE_KWARGS, when="sm120_sparse_decode_not_native",
        callers=("sglang.srt.layers.attention.deepseek_v4_backend",),
        note="deepseek_v4_backend.py imports it inside the forward, at call time",
    ),
    # 0.5.16+: the same dispatcher moved to sglang.kernels.ops.attention (FlashInfer by default).
    Target(
        op="sparse_decode", module=SM120_DISPATCHER, attr="flash_mla_with_kvcache_sm120",
        replacement="deepseek_v4_kernel.patch.adapters:flash_mla_with_kvcache_sm120",
        first="0.5.16", params=_SPARSE_DECODE_KWARGS, when="sm120_sparse_decode_not_native",
        callers=("sglang.srt.layers.attention.deepseek_v4_backend",),
        note="deepseek_v4_backend.py imports it inside the forward, at call time",
    ),
    # 0.5.20+: under attention TP, decode q (<= 64 tokens) is padded to 64 heads on SM120 for FlashMLA's h_q
    # specialisation unless FlashInfer's native kernel takes the rank's heads; with ours as the dispatcher the
    # pad only costs a 64-head launch for 8 / 16 / 32 real heads (docs/sparse_decode.md, "Unpadded query heads").
    # 0.5.12-0.5.19 pad inline in the forward (no method to replace).
    Target(
        op="sparse_decode", module="sglang.srt.models.deepseek_v4", attr="MqaAttentionBase._kernel_num_heads",
        replacement="deepseek_v4_kernel.patch.adapters:kernel_num_heads",
        first="0.5.20", params=("self", "num_tokens"), when="sm120_sparse_decode_is_ours",
        callers=("sglang.srt.models.deepseek_v4",),
        note="the attention forward calls self._kernel_num_heads(x.shape[0]) per call",
    ),
    # --- indexer paged MQA logits (docs/indexer_logits.md) -----------------------------------
    # 0.5.12-0.5.15.post1 default to DeepGEMM's fp8_paged_mqa_logits, which has no SM120 kernel,
    # and nothing in SGLang picks another path on SM120: select SGLang's torch path (its metadata
    # code then skips `import deep_gemm` too) and replace that function with ours.
    Target(
        op="indexer_logits", module="", attr="SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", kind="env", value="1",
        first="0.5.12", last="0.5.15.post1",
        note="dsv4/indexer.py:380 (0.5.12) reads it at call time; no SM120 override before 0.5.16",
    ),
    Target(
        op="indexer_logits", module="sglang.srt.layers.attention.dsv4.indexer", attr="fp8_paged_mqa_logits_torch",
        replacement="deepseek_v4_kernel.patch.adapters:fp8_paged_mqa_logits_sglang_fallback",
        first="0.5.12", last="0.5.12.post1", params=_INDEXER_PARAMS,
        note="chosen by the env gate; looked up as a module global at call time",
    ),
    Target(
        op="indexer_logits", module="sglang.srt.layers.attention.dsv4.indexer", attr="fp8_paged_mqa_logits_torch_sm120",
        replacement="deepseek_v4_kernel.patch.adapters:fp8_paged_mqa_logits_sglang_fallback",
        first="0.5.13", params=_INDEXER_PARAMS,
        note="SGLang's torch SM120 path (env gate before 0.5.16; SGLang's own SM120 flags after)",
    ),
    # 0.5.16+: SGLang sets SGLANG_OPT_USE_TILELANG_INDEXER on SM120, and the TileLang kernel wins
    # the dispatch; it is imported from its module at call time. Earlier versions reach TileLang
    # only when the user sets that flag.
    Target(
        op="indexer_logits", module="sglang.srt.layers.attention.dsv4.tilelang_kernel",
        attr="tilelang_fp8_paged_mqa_logits",
        replacement="deepseek_v4_kernel.patch.adapters:tilelang_fp8_paged_mqa_logits",
        first="0.5.12", last="0.5.12.post1", params=_INDEXER_PARAMS,
    ),
    Target(
        op="indexer_logits", module="sglang.srt.layers.attention.dsa.tilelang_kernel",
        attr="tilelang_fp8_paged_mqa_logits",
        replacement="deepseek_v4_kernel.patch.adapters:tilelang_fp8_paged_mqa_logits",
        first="0.5.13", last="0.5.15.post1", params=_INDEXER_PARAMS,
    ),
    Target(
        op="indexer_logits", module="sglang.kernels.ops.attention.dsa.tilelang_kernel",
        attr="tilelang_fp8_paged_mqa_logits",
        replacement="deepseek_v4_kernel.patch.adapters:tilelang_fp8_paged_mqa_logits",
        first="0.5.16", params=_INDEXER_PARAMS,
    ),
    # --- fp4_moe (docs/fp4_moe.md, docs/sglang_surface.md) --------------------------------------
    # DeepSeek-V4's MXFP4 experts load into Fp8MoEMethod (int8 packed e2m1, fp32 UE8M0 scales).
    # On the Triton MoE runner SGLang feeds them to its fp8 kernel, which stops with "Hidden size
    # mismatch": on SM120 that is the default of 0.5.12-0.5.15.post1 (auto -> triton without
    # DeepEP); from 0.5.16 SGLang picks FlashInfer's native SM120 MXFP4 kernel (flashinfer_mxfp4)
    # and reaches this path only with --moe-runner-backend triton. Ours hands back every other case.
    Target(
        op="fp4_moe", module="sglang.srt.layers.quantization.fp8", attr="Fp8MoEMethod.apply",
        replacement="deepseek_v4_kernel.patch.adapters:fp8_moe_method_apply",
        first="0.5.12", params=("self", "layer", "dispatch_output"),
        callers=("sglang.srt.layers.moe.fused_moe_triton.layer",),
        note="FusedMoE calls self.quant_method.apply(layer=self, dispatch_output=...) per forward",
    ),
    # 0.5.16+: on SM120 SGLang resolves `--moe-runner-backend auto` to flashinfer_mxfp4 for DeepSeek-V4's MXFP4
    # experts, whose quant method is FlashInfer's, not Fp8MoEMethod: ours never runs there. These rows wrap the point
    # of that resolution (in the launcher) and declare the triton runner instead where ours was measured faster on
    # this GPU, or where FlashInfer's runner cannot run (patch/moe_runner.py). A backend the user passed is never
    # changed: SGLang declares flashinfer_mxfp4 only for `auto`. 0.5.16-0.5.18: the post-process pass
    # `_deepseek_v4_sm120_moe(view)` (0.5.17 overrides.py:1836-1847), imported by server_args.py at call time
    # (0.5.17 server_args.py:5299-5306); 0.5.19+: DeepSeek-V4's model override provider (0.5.23
    # model_overrides/deepseek_v4.py:67-89), registered by reference, so the wrap is at `_invoke_provider`, which
    # overrides.py imports by name (0.5.23 overrides.py:45, called at :294 / :299).
    Target(
        op="fp4_moe", module="sglang.srt.arg_groups.overrides", attr="_deepseek_v4_sm120_moe",
        replacement="deepseek_v4_kernel.patch.adapters:deepseek_v4_sm120_moe",
        first="0.5.16", last="0.5.18", params=("view",), when="moe_runner_chosen_at_start_up",
        note="server_args.py imports it inside __post_init__ and runs it with run_post_process_pass",
    ),
    Target(
        op="fp4_moe", module="sglang.srt.arg_groups.model_override_base", attr="_invoke_provider",
        replacement="deepseek_v4_kernel.patch.adapters:invoke_model_override",
        first="0.5.19", params=("fn", "server_args", "hf_config"), when="moe_runner_chosen_at_start_up",
        importers=("sglang.srt.arg_groups.overrides",),
        note="overrides.py calls it for every registered model override provider",
    ),
    # --- measured dispatch (patch/decisions.py, bench/startup.py) -------------------------------------
    # Each worker decides, after its weights load and before SGLang sizes its KV cache and captures graphs.
    Target(
        op="measured_dispatch", module="sglang.srt.model_executor.model_runner", attr="ModelRunner.load_model",
        replacement="deepseek_v4_kernel.patch.adapters:model_runner_load_model",
        first="0.5.12", params=("self",), when="measured_dispatch_on",
        note="ModelRunner.initialize calls self.load_model() (0.5.12:655, 0.5.17:597, 0.5.23:715)",
    ),
    # --- hc_prenorm (docs/hc_prenorm.md) ------------------------------------------------------
    # Whoever imports DeepGEMM gets our pre-norm GEMM (DeepGEMM's is SM90/SM100 only; 0.5.12
    # calls it directly from srt/layers/mhc.py and models/deepseek_v4.py).
    Target(
        op="hc_prenorm", module="deep_gemm", attr="tf32_hc_prenorm_gemm",
        replacement="deepseek_v4_kernel.patch.adapters:tf32_hc_prenorm_gemm",
        first="0.5.12", params=("num_splits",),
        note="callers pass (x, fn, out, sqrsum, num_splits=...)",
    ),
    # SGLang's wrapper: on SM120 ENABLE_JIT_DEEPGEMM is False, so `deep_gemm` is never bound in
    # it and the original would raise NameError whenever a caller chooses this path.
    Target(
        op="hc_prenorm", module="sglang.srt.layers.deep_gemm_wrapper.entrypoint", attr="tf32_hc_prenorm_gemm",
        replacement="deepseek_v4_kernel.patch.adapters:sglang_tf32_hc_prenorm_gemm",
        first="0.5.13", params=("x", "fn", "out", "sqrsum", "num_splits"),
        note="imported inside the callers' functions, at call time",
    ),
    # SGLang's switch for the DeepGEMM pre-norm path (read at call time). On SM120, 0.5.13-0.5.19 set it off in
    # the launching process whatever the user said (0.5.13 server_args.py:2120 ... 0.5.19 model_hook.py:343),
    # after this layer set it: reassert sets it again in the processes the launcher starts (its scheduler and
    # TP workers, spawned: each installs this layer at its first `import sglang`, before SGLang's code runs),
    # unless the user set it. 0.5.20-0.5.23 turn it off only when unset (model_hook.py: 0.5.20:393, 0.5.21:455,
    # 0.5.22:487, 0.5.23:494). From 0.5.21 SGLang's gate also needs ENABLE_JIT_DEEPGEMM
    # (mhc._use_deep_gemm_hc_prenorm), replaced below. The condition keeps the flag off where it would lead to an
    # `import deep_gemm` that no installed module answers.
    Target(
        op="hc_prenorm", module="", attr="SGLANG_OPT_DEEPGEMM_HC_PRENORM", kind="env", value="1",
        first="0.5.13", last="0.5.23", when="hc_prenorm_gate_cannot_reach_a_missing_deep_gemm", reassert=True,
        note="read at call time by deepseek_v4.py's hc_pre (from 0.5.20 only at >= 1024 tokens) and mhc",
    ),
    Target(
        op="hc_prenorm", module="sglang.kernels.ops.layernorm.mhc", attr="_use_deep_gemm_hc_prenorm",
        replacement="deepseek_v4_kernel.patch.adapters:use_deep_gemm_hc_prenorm",
        first="0.5.21", last="0.5.23", params=(),
        note="module global, called at call time by mhc_pre and the fused post/pre step",
    ),
    # SGLang's SM120 mHC pre step (imported from its module at call time, deepseek_v4.py 0.5.23:3422): wrapped, not
    # replaced, so that the replaced gate above knows the call's rows (measured per size class: patch/measured.py).
    Target(
        op="hc_prenorm", module="sglang.kernels.ops.layernorm.mhc", attr="mhc_pre",
        replacement="deepseek_v4_kernel.patch.adapters:mhc_pre",
        first="0.5.21", last="0.5.23", params=("residual", "fn"),
        note="SGLang's own mhc_pre runs, told its rows (SGLang asks the gate without them)",
    ),
    # --- fp8_linear (docs/sglang_surface.md, "Block-FP8 linears") ------------------------------------------------
    # Every DeepSeek-V4 dense FP8 linear calls quant_method.apply(self, x, bias) (layers/linear.py); Fp8LinearMethod
    # then runs self.w8a8_block_fp8_linear, which --fp8-gemm-backend chose (SM120: auto -> cutlass, or triton,
    # deep_gemm, flashinfer_cutlass) and which quantizes x itself. Ours takes x in bf16 at decode sizes and hands
    # the rest back (patch/fp8_adapters.py).
    Target(
        op="fp8_linear", module="sglang.srt.layers.quantization.fp8", attr="Fp8LinearMethod.apply",
        replacement="deepseek_v4_kernel.patch.adapters:fp8_linear_method_apply",
        first="0.5.12", params=("self", "layer", "x", "bias"),
        callers=("sglang.srt.layers.linear",),
        note="LinearBase.forward calls self.quant_method.apply(self, x, bias) per forward",
    ),
    # FP8 wo_a: SGLang turns SGLANG_OPT_FP8_WO_A_GEMM off on SM120 in the launching process (0.5.16-0.5.20
    # unconditionally: 0.5.17 server_args.py:5310, 0.5.20 model_hook.py:387; 0.5.21-0.5.23 unless set:
    # 0.5.23 model_hook.py:485, then serving_hook.py:475-493 turns even a set value off without DeepGEMM's SM120
    # kernels) and dequantizes wo_a to bf16 at load. The workers read it when deepseek_v4 is imported (0.5.17
    # deepseek_v4.py:202): reassert sets it again there, before that import.
    Target(
        op="fp8_linear", module="", attr=FP8_WO_A_ENV, kind="env", value="1",
        first="0.5.12", last="0.5.23", when="fp8_wo_a_path_takes_ours", reassert=True,
        note="read at import by deepseek_v4.py (_FP8_WO_A_GEMM) and at load (no dequant of wo_a)",
    ),
    # its activation quantization (deepseek_v4's module globals, called only for wo_a): deferred, so ours gets bf16
    Target(
        op="fp8_linear", module="sglang.srt.models.deepseek_v4", attr="sglang_per_token_group_quant_fp8",
        replacement="deepseek_v4_kernel.patch.adapters:wo_a_quant_fp32_scales",
        first="0.5.16", last="0.5.23", params=("x", "group_size", "scale_ue8m0"), when="fp8_wo_a_gemm_on",
        callers=("sglang.srt.models.deepseek_v4",),
        note="the wo_a forward's fp32-scale branch (no DeepGEMM SM120 build): recipe (1, 128, 128)",
    ),
    Target(
        op="fp8_linear", module="sglang.srt.models.deepseek_v4", attr="sglang_per_token_group_quant_fp8_dsv4_wo_a",
        replacement="deepseek_v4_kernel.patch.adapters:wo_a_quant_ue8m0",
        first="0.5.16", last="0.5.23", params=("x",), when="fp8_wo_a_gemm_on",
        callers=("sglang.srt.models.deepseek_v4",),
        note="the wo_a forward's UE8M0 branch (DEEPGEMM_SCALE_UE8M0: DeepGEMM's SM100 / SM120 builds)",
    ),
    # its grouped GEMM: deep_gemm.fp8_einsum, called after `import deep_gemm` in the forward (0.5.16-0.5.22) ...
    Target(
        op="fp8_linear", module="deep_gemm", attr="fp8_einsum",
        replacement="deepseek_v4_kernel.patch.adapters:deep_gemm_fp8_einsum",
        first="0.5.16", last="0.5.22", params=("recipe",),
        callers=("sglang.srt.models.deepseek_v4",),
        note="fp8_einsum('bhr,hdr->bhd', (o_fp8, o_s), (wo_a, scale), out, recipe=...); other calls are DeepGEMM's",
    ),
    # ... and through SGLang's own wrapper (0.5.23), a module global looked up at call time
    Target(
        op="fp8_linear", module="sglang.srt.models.deepseek_v4", attr="_fp8_wo_a_einsum",
        replacement="deepseek_v4_kernel.patch.adapters:fp8_wo_a_einsum",
        first="0.5.23", last="0.5.23", params=("o_fp8", "o_s", "weight", "weight_scale", "recipe", "out"),
        when="fp8_wo_a_gemm_on", callers=("sglang.srt.models.deepseek_v4",),
        note="_fp8_wo_a_einsum(o_fp8, o_s, weight, weight_scale, recipe=...)",
    ),
)


def measured_gate(op: str, condition: Optional[Callable[[Any], Tuple[bool, str]]]):
    """A row's condition under DSV4_KERNEL_PREFER=measured: the measured file must say ours won a size class of
    ``op`` on this GPU (patch/measured.py: a missing or stale file patches nothing), then the row's own condition
    (if any) decides as before. Without that setting, exactly the row's own condition (or none)."""
    def gated(arg) -> Tuple[bool, str]:
        if measured.prefer_measured():
            ours, why = measured.op_decision(op)
            if not ours:
                return False, why
        return condition(arg) if condition is not None else (True, "always on SM12x")
    # the README's table shows the first line of a condition's docstring: unchanged by the gate
    gated.__doc__ = condition.__doc__ if condition is not None else "always on SM12x"
    gated.__dsv4_measured_gate__ = op
    return gated


def _gate_rows(rows: Tuple[Target, ...]) -> Tuple[Target, ...]:
    """Every row gets measured_gate: a row with a condition keeps its name (the gate wraps it, one op per
    condition); a row without one gets 'measured_gate:<op>', which reads as 'always on SM12x'."""
    import dataclasses

    out = []
    for t in rows:
        name = t.when or f"measured_gate:{t.op}"
        current = CONDITIONS.get(name)
        gated_op = getattr(current, "__dsv4_measured_gate__", None)
        if gated_op is None:
            CONDITIONS[name] = measured_gate(t.op, current)
        elif gated_op != t.op:
            raise ValueError(f"condition {name!r} serves ops {gated_op!r} and {t.op!r}: give each op its own")
        out.append(t if t.when else dataclasses.replace(t, when=name))
    return tuple(out)


TARGETS = _gate_rows(TARGETS)


def targets_for(op: str) -> Tuple[Target, ...]:
    return tuple(t for t in TARGETS if t.op == op)


def markdown_table() -> str:
    """The README's table of what is patched per SGLang version (a test keeps the README equal to it)."""
    rows = ["| op | SGLang versions | what | replaced by / set to | when |", "|---|---|---|---|---|"]
    for t in TARGETS:
        what = f"`{t.module}.{t.attr}`" if t.kind != "env" else f"env `{t.attr}`"
        by = f"`{t.replacement}`" if t.kind == "replace" else f"`{t.value!r}`"
        when = CONDITIONS[t.when].__doc__.strip().splitlines()[0] if t.when else "always on SM12x"
        if t.reassert:
            when += " Set again in the worker processes of a launcher that changed it, unless the user set it."
        rows.append(f"| {t.op} | {t.version_text()} | {what} | {by} | {when} |")
    return "\n".join(rows)
