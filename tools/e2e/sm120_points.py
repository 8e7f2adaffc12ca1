"""Where SGLang 0.5.17 decides by GPU architecture on DeepSeek-V4's path, and what the harness does with each.

Each row: (file under the wheel's ``sglang/``, line, text on that line, what it decides, handling). Handling is one of
* ``view``: decided by a predicate of sglang.srt.utils.common that the SM120 view forces (sm120_shim), so it comes
  out as on an RTX PRO 6000 in every process; module-level constants computed from it come out so too, as the
  predicates are replaced before any other module imports them;
* ``view+flag``: the view leads to a kernel built for sm_120 only, so setups (a)/(b) also pass SGLang's own
  fallback option for that piece (``flag``), as an RTX PRO 6000 user could; the results table says so;
* ``real``: a direct ``torch.cuda.get_device_capability`` read that picks a kernel for the real GPU (it must stay
  real: the kernel runs there), or that comes out the same for 9.0 and 12.0;
* ``same``: comes out the same on sm_90 and sm_120 (no forcing needed, listed for completeness);
* ``off-path``: not reached by DeepSeek-V4 with the harness's arguments.

tests/e2e/test_sm120_shim.py checks every row against the unpacked 0.5.17 wheel (the text must be on that line) and
that every predicate call in the files of FULLY_SCANNED is a row here (a new decision point fails the test).
"""

from __future__ import annotations

import re
from typing import NamedTuple, Tuple

SGLANG_VERSION = "0.5.17"


class Point(NamedTuple):
    file: str
    line: int
    text: str
    decides: str
    handling: str
    flag: str = ""


POINTS: Tuple[Point, ...] = (
    # --- the predicates themselves ------------------------------------------------------------------------------
    Point("srt/utils/common.py", 281, "is_sm120_supported = lru_cache(maxsize=1)(",
          "majors [12], CUDA >= 12.8", "view"),
    Point("srt/utils/common.py", 274, "is_blackwell_supported = is_blackwell = lru_cache(maxsize=1)(",
          "majors [10, 11, 12]", "view"),
    Point("srt/utils/common.py", 305, "is_sm90_supported = lru_cache(maxsize=1)(",
          "majors [9]: True on the H200, False on SM120", "view"),
    Point("srt/utils/common.py", 269, "is_hopper_with_cuda_12_3 = lru_cache(maxsize=1)(", "majors [9]", "view"),
    Point("srt/utils/common.py", 602, "def get_device_sm():", "major*10+minor: 120 on SM120", "view"),
    Point("srt/utils/common.py", 955, "def get_device_capability(device_id: int = 0) -> Tuple[int, int]:",
          "(12, 0) on SM120", "view"),
    # --- server arguments (launcher; workers inherit the environment it sets) --------------------------------------
    Point("srt/server_args.py", 5306, "run_post_process_pass(self, _deepseek_v4_sm120_moe)",
          "DeepSeek-V4's SM120 MoE default (overrides.py:1842)", "view"),
    Point("srt/arg_groups/overrides.py", 1842, 'if is_sm120_supported() and view.moe_runner_backend == "auto":',
          "auto MoE runner -> flashinfer_mxfp4 (FlashInfer CUTLASS MXFP8 x MXFP4, built for sm_120 only)",
          "view+flag", "--moe-runner-backend marlin (a) / triton (b: our MoE)"),
    Point("srt/server_args.py", 5307, "if is_sm120_supported():",
          "SGLANG_OPT_FP8_WO_A_GEMM, _USE_TOPK_V2, _USE_TILELANG_MHC_PRE, _DEEPGEMM_HC_PRENORM off; "
          "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH and SGLANG_OPT_USE_TILELANG_INDEXER on", "view"),
    Point("srt/server_args.py", 7736, "is_sm100_supported() or is_sm120_supported()",
          "--enable-deepseek-v4-fp4-indexer allowed (not enabled)", "off-path"),
    Point("srt/server_args.py", 7749, "sm = get_device_sm()", "FP8 wo_a GEMM: only logged", "view"),
    Point("srt/server_args.py", 7753, "and is_sm90_supported()",
          "FP8 wo_a GEMM on sm90 only if set explicitly (off in every setup: not set)", "view"),
    Point("srt/server_args.py", 5682, "if is_hopper_with_cuda_12_3() and is_no_spec_infer_or_topk_one(",
          "default attention backend (DeepSeek-V4 forces dsv4, overrides.py:1092)", "off-path"),
    Point("srt/server_args.py", 5713, "if is_hopper_with_cuda_12_3():", "default MLA backend (dsv4 forced)",
          "off-path"),
    Point("srt/arg_groups/overrides.py", 1897, "and (is_sm90_supported() or is_sm100_supported())",
          "FlashInfer all-reduce fusion at TP > 1 for listed archs (DeepSeek-V4 not listed)", "off-path"),
    # --- DeepGEMM -------------------------------------------------------------------------------------------------
    Point("srt/layers/deep_gemm_wrapper/configurer.py", 18, "sm_version = get_device_sm()",
          "ENABLE_JIT_DEEPGEMM (module constant)", "view"),
    Point("srt/layers/deep_gemm_wrapper/configurer.py", 22, "if sm_version == 120:",
          "no DeepGEMM on SM120: FP8 linears, indexer metadata, MoE and hc_prenorm leave DeepGEMM", "view"),
    Point("srt/layers/deep_gemm_wrapper/configurer.py", 37,
          "DEEPGEMM_BLACKWELL = ENABLE_JIT_DEEPGEMM and is_sm100_supported()", "UE8M0 DeepGEMM scales", "same"),
    # --- FP8 linears ----------------------------------------------------------------------------------------------
    Point("srt/layers/quantization/fp8_utils.py", 641, 'if backend == "auto" and is_sm120_supported():',
          "FP8 block GEMM -> 'cutlass': SGLang's JIT CUTLASS kernel for sm_120 only "
          "(kernels/ops/gemm/fp8_blockwise_gemm.py:33)", "view+flag", "--fp8-gemm-backend triton (a, b)"),
    Point("srt/layers/quantization/fp8_utils.py", 583, "if not is_sm120_supported():",
          "explicit cutlass backend allowed only on SM120", "view"),
    Point("srt/layers/quantization/fp8_utils.py", 628, "elif is_sm120_supported():", "auto dispatch order",
          "view"),
    Point("srt/layers/quantization/fp8_utils.py", 626, "elif is_blackwell_supported() and is_flashinfer_available():",
          "auto dispatch order (not reached: the backend is set)", "view"),
    Point("srt/layers/quantization/fp8_utils.py", 62, "_is_sm100_supported = is_sm100_supported()",
          "module constant (MXFP8 paths)", "same"),
    Point("srt/layers/quantization/fp8_utils.py", 63, "_is_sm120_supported = is_sm120_supported()",
          "module constant: MXFP8 Triton stages (not DeepSeek-V4)", "view"),
    Point("srt/layers/quantization/fp8_utils.py", 230, "return get_device_capability() >= (9, 4) and torch_release",
          "ROCm only", "off-path"),
    Point("srt/layers/quantization/fp8_utils.py", 241, "major, minor = get_device_capability()",
          "cutlass_fp8_supported: major >= 9 (9 and 12 alike)", "same"),
    Point("srt/layers/quantization/fp8_utils.py", 314, "if is_blackwell_supported() and is_flashinfer_available():",
          "FlashInfer FP8 GEMM helpers defined", "view"),
    Point("srt/layers/quantization/fp8_utils.py", 354, "major, minor = get_device_capability()",
          "FlashInfer groupwise backend (flashinfer backends only)", "off-path"),
    Point("srt/layers/quantization/fp8_utils.py", 467, "if is_sm90_supported() and is_flashinfer_available():",
          "FlashInfer DeepGEMM swapAB helpers (flashinfer_deepgemm backend only)", "off-path"),
    Point("srt/layers/quantization/fp8_utils.py", 556, "if not (is_sm100_supported() and is_flashinfer_available()):",
          "explicit flashinfer_trtllm backend check", "off-path"),
    Point("srt/layers/quantization/fp8_utils.py", 565,
          "if not (is_blackwell_supported() and is_flashinfer_available()):",
          "explicit flashinfer_cutlass backend check", "off-path"),
    Point("srt/layers/quantization/fp8_utils.py", 574, "if not (is_sm90_supported() and is_flashinfer_available()):",
          "explicit flashinfer_deepgemm backend check", "off-path"),
    Point("srt/layers/quantization/fp8_utils.py", 2031, "major, minor = get_device_capability()",
          "Marlin FP8 for sm80-88 only", "same"),
    Point("kernels/ops/quantization/fp8_kernel.py", 54, "_is_sm100_supported = is_sm100_supported()",
          "module constant", "same"),
    Point("kernels/ops/quantization/fp8_kernel.py", 55, "_is_sm120_supported = is_sm120_supported()",
          "Triton MXFP8 matmul stages (not DeepSeek-V4)", "view"),
    Point("kernels/ops/gemm/fp8_blockwise_gemm.py", 33, "if not is_sm120_supported():",
          "the sm_120 CUTLASS FP8 GEMM refuses other GPUs (not reached: --fp8-gemm-backend triton)", "view+flag",
          "--fp8-gemm-backend triton (a, b)"),
    # --- attention --------------------------------------------------------------------------------------------------
    Point("srt/layers/attention/deepseek_v4_backend.py", 83, "_is_sm120 = is_sm120_supported()",
          "module constant of the dsv4 backend", "view"),
    Point("srt/layers/attention/deepseek_v4_backend.py", 139, "if _is_sm120 or _is_xpu:",
          "no FlashMLA schedule metadata", "view"),
    Point("srt/layers/attention/deepseek_v4_backend.py", 659, "self.enable_deepseek_v4_fp4_indexer and _is_sm120",
          "FP4 indexer metadata (not enabled)", "off-path"),
    Point("srt/layers/attention/deepseek_v4_backend.py", 1704, "and not _is_sm120",
          "no FlashMLA sparse prefill on SM120", "view"),
    Point("srt/layers/attention/deepseek_v4_backend.py", 1720, "if _is_sm120:",
          "sparse MLA through flash_mla_with_kvcache_sm120 (its default backend, FlashInfer's SM120 kernel, is "
          "built for sm_120 only)", "view+flag", "SGLANG_SM120_FLASHMLA_BACKEND=triton (a, b; (b) replaces it)"),
    Point("srt/layers/attention/dsv4/indexer.py", 713, "if is_sm120_supported():",
          "torch SM120 paged MQA logits (behind the TileLang indexer, which server_args.py:5314 turns on)", "view"),
    # --- model ------------------------------------------------------------------------------------------------------
    Point("srt/models/deepseek_v4.py", 218,
          "and (envs.SGLANG_OPT_USE_TILELANG_MHC_PRE.get() or is_sm120_supported())",
          "fused mHC post/pre (only with SGLANG_OPT_FUSE_MHC_POST_PRE=1, default off)", "view"),
    Point("srt/models/deepseek_v4.py", 658,
          "self._multi_stream_bs_limit = 128 if is_blackwell_supported() else 64",
          "multi-stream batch limit 128 on Blackwell", "view"),
    Point("srt/models/deepseek_common/utils.py", 48, "_device_sm = get_device_sm()",
          "module constant used by deepseek_v2's gate", "view"),
    Point("srt/models/deepseek_v2.py", 526, "max_router_gemm_tokens = 4 if _device_sm in (100, 103) else 16",
          "router GEMM token limit (16 on 90 and 120)", "same"),
    Point("srt/models/deepseek_v2.py", 532, "and _device_sm >= 90", "dsv3 router GEMM (90 and 120 alike)", "same"),
    Point("srt/models/deepseek_v2.py", 758, "and is_sm100_supported()", "NVFP4 shared-expert fusion", "off-path"),
    Point("srt/models/deepseek_v2.py", 3011,
          '(not _is_cuda or torch.cuda.get_device_capability("cuda") < (8, 0))',
          "DeepSeek-V2/V3 MLA weight absorption path (not V4)", "off-path"),
    Point("srt/models/deepseek_v2.py", 3012,
          'and (not _is_hip or torch.cuda.get_device_capability("cuda") < (9, 4))', "ROCm", "off-path"),
    Point("srt/models/deepseek_v2.py", 3013,
          'and (not _is_musa or torch.musa.get_device_capability("musa") < (3, 1))', "MUSA", "off-path"),
    Point("srt/models/deepseek_v2.py", 3021, 'not _is_hip or torch.cuda.get_device_capability("cuda") < (9, 4)',
          "ROCm", "off-path"),
    # --- MoE --------------------------------------------------------------------------------------------------------
    Point("srt/layers/quantization/fp8.py", 400, "if is_sm90_supported() or is_sm120_supported():",
          "flashinfer_mxfp4 -> FlashInfer CUTLASS method (SM90 W4A16 / SM120 W4A8)", "view"),
    Point("srt/layers/quantization/mxfp4_flashinfer_cutlass_moe.py", 38,
          "self._use_mxfp8_act_scaling = is_sm120_supported()",
          "W4A8 (sm_120 only) instead of W4A16", "view+flag", "not used in (a)/(b): marlin / triton runner"),
    Point("srt/layers/quantization/mxfp4_marlin_moe.py", 143,
          "if not is_sm90_supported() and not is_sm120_supported():", "Marlin MXFP4 allowed on 90 and 120",
          "same"),
    Point("srt/layers/quantization/fp8.py", 1072, "is_sm100_supported() or is_sm90_supported() or is_sm120_supported()",
          "cutlass FP8 MoE backend check", "off-path"),
    Point("srt/layers/quantization/fp8.py", 1668, "if get_moe_a2a_backend().is_megamoe() and is_sm90_supported():",
          "MegaMoE (not used)", "off-path"),
    Point("srt/layers/quantization/fp8.py", 1721, "(_is_cuda and is_sm100_supported()) or (_is_hip and",
          "MXFP8 MoE", "off-path"),
    Point("srt/layers/moe/utils.py", 317, "if torch.cuda.get_device_capability()[0] == 9:",
          "single-batch overlap refused on sm90 (not enabled)", "off-path"),
    Point("srt/layers/moe/moe_runner/runner.py", 101, "major, minor = torch.cuda.get_device_capability()",
          "hpc_ops runner (not used)", "off-path"),
    # --- loader and kernels that stay on the real GPU -------------------------------------------------------------
    Point("srt/model_loader/loader.py", 283, "major, minor = get_device_capability()",
          "quantization's minimum capability (fp8: 89; 90 and 120 pass)", "view"),
    Point("srt/layers/activation.py", 88, "major, _ = torch.cuda.get_device_capability()",
          "vector width of SGLang's JIT activation kernel, compiled for the real GPU", "real"),
    Point("kernels/jit/utils/arch.py", 99, "major, minor = torch.cuda.get_device_capability(device)",
          "target of every SGLang JIT kernel build (sm_90a on the H200)", "real"),
)

# Files where every predicate call / capability read is a row above (the test scans them).
FULLY_SCANNED = (
    "srt/layers/deep_gemm_wrapper/configurer.py",
    "srt/layers/attention/deepseek_v4_backend.py",
    "srt/layers/attention/dsv4/indexer.py",
    "srt/models/deepseek_v4.py",
    "srt/models/deepseek_v2.py",
    "srt/models/deepseek_common/utils.py",
    "srt/layers/quantization/fp8.py",
    "srt/layers/quantization/fp8_utils.py",
    "kernels/ops/quantization/fp8_kernel.py",
    "srt/layers/quantization/mxfp4_marlin_moe.py",
    "srt/layers/quantization/mxfp4_flashinfer_cutlass_moe.py",
    "srt/model_loader/loader.py",
    "srt/layers/moe/utils.py",
    "srt/layers/moe/moe_runner/runner.py",
    "kernels/ops/gemm/fp8_blockwise_gemm.py",
    "srt/layers/activation.py",
)

# A predicate call or a capability read (imports and definitions are not decisions).
DECISION_RE = re.compile(
    r"is_sm120_supported\(\)|is_sm90_supported\(\)|is_blackwell(_supported)?\(\)|is_sm100_supported\(\)"
    r"|is_sm100_or_sm110_supported\(\)|is_hopper_with_cuda_12_3\(\)|get_device_sm\(\)|get_device_capability\(")


def decision_lines(text: str):
    """(line number, line) of every decision in a source file's text."""
    for i, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith(("def ", "#", "from ", "import ")):
            continue
        if DECISION_RE.search(line):
            yield i, line


def markdown_table() -> str:
    rows = ["| file:line (SGLang 0.5.17) | decides | harness |", "|---|---|---|"]
    for p in POINTS:
        how = p.handling + (f": {p.flag}" if p.flag else "")
        rows.append(f"| `{p.file}:{p.line}` | {p.decides} | {how} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
