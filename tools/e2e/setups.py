"""The three setups of the end-to-end comparison and the server command of each (pure: no GPU, no SGLang import).

(a) stock SGLang 0.5.17 on its SM120 paths (the harness's SM120 view); where SM120's default kernel is built for
    sm_120 only, SGLang's own fallback for that piece, as an RTX PRO 6000 user could choose it;
(b) (a) with our patch (build/dsv4 on the path, DSV4_KERNEL_FORCE=1 since the test GPU is not SM12x);
(c) stock SGLang on the test GPU's native sm_90 paths: FlashMLA and DeepGEMM, DeepSeek's own kernels (the reference).

The MoE piece (routed experts are MXFP4): SGLang 0.5.17 on SM120 picks ``flashinfer_mxfp4`` (overrides.py:1842),
FlashInfer's CUTLASS MXFP8 x MXFP4 kernel, built for sm_120 only. Its ``triton`` runner cannot take MXFP4 experts: it
passes the int8 weights as FP8 and stops at "Hidden size mismatch" (fp8.py:2296-2316 -> fused_moe.py:915). So
(a) and (c) run SGLang's Marlin MXFP4 runner (``--moe-runner-backend marlin``: Mxfp4MarlinMoEMethod, allowed on
sm90 and sm120, mxfp4_marlin_moe.py:143; mma.sync, W4A16), and (b) the triton runner, whose Fp8MoEMethod.apply our
patch replaces. The native alternative for (c), ``flashinfer_mxfp4`` on sm90 (FlashInfer CUTLASS W4A16), is
selectable with ``moe_c``.

Instruction class. (a) and (b) are the SM120 view, so their JIT-built kernels are built in SM120's instruction class
("mma": no wgmma) unless a session asks for the test GPU's own ("native", session suffix ``-native``):
* Triton: ``DISABLE_MMA_V3=1``. Triton 3.6.0 reads it in libtriton (``supportMMA(op, 3)`` in lib/Analysis/
  Utility.cpp answers no, so AccelerateMatmul takes MMA v2 = mma.sync instead of v3 = wgmma; the variable's name is
  in the installed libtriton.so) and lists it in ``get_cache_invalidating_env_vars()``,
  so it is part of every kernel's cache key; each class still gets its own TRITON_CACHE_DIR (and TorchInductor's and
  TileLang's cache directories), so no cache directory ever holds both classes.
* TileLang 0.1.11 has no environment variable for it: ``tl.disable_wgmma`` is a pass config (PassConfigKey
  TL_DISABLE_WGMMA, read by its GEMM lowering, src/cuda/op/gemm.cc). The harness shim adds it to every
  ``tilelang.jit`` call in the server's processes (``DSV4_E2E_TL_DISABLE_WGMMA=1``): SGLang 0.5.17's TileLang kernels
  (the indexer's fp8_paged_mqa_logits and act_quant in tilelang_kernel.py, mhc.py's kernels through its lazy
  ``_load_tilelang().jit``) all compile through that attribute. TileLang's cache key includes the pass configs.
* What cannot be forced: cuBLAS / cuBLASLt (the bf16 linears: lm_head, wo_a, the compressors' gates, the router above
  16 rows, and the fp32 mHC GEMM of (a)) pick their own sm90 kernels (nvjet, wgmma); sgl_kernel's prebuilt sm90
  kernels and SGLang's JIT CUDA kernels (tvm-ffi) are built for the real GPU (elementwise, routing, quant; Marlin is
  mma.sync already); FlashInfer's JIT norms have no MMA. Our compiled kernels use mma.sync on every GPU.
(c) is the native reference and always runs the native class.

Extra server arguments and environment per setup (for new patches: an FP8 linear op, FP8 wo_a) go in
SETUP_EXTRA_ARGS / SETUP_EXTRA_ENV, or on the command line (run_e2e.py --setup-arg / --setup-env), without touching
the setups. ``default_variant`` is setup (b) "with default settings": no MoE runner flag and no DSV4_KERNEL_PREFER.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

SETUP_KEYS = ("a", "b", "c")
CLASSES = ("mma", "native")
# Triton and TileLang in SM120's instruction class on the test GPU (see above)
MMA_CLASS_ENV = (("DISABLE_MMA_V3", "1"), ("DSV4_E2E_TL_DISABLE_WGMMA", "1"))
# per setup: server arguments and environment added to the setup's own (data, so new patches need no code here)
SETUP_EXTRA_ARGS: Dict[str, Tuple[str, ...]] = {"a": (), "b": (), "c": ()}
SETUP_EXTRA_ENV: Dict[str, Tuple[Tuple[str, str], ...]] = {"a": (), "b": (), "c": ()}


@dataclass(frozen=True)
class Setup:
    key: str
    title: str
    sm120_view: bool
    our_patch: bool
    moe_runner: str
    server_args: Tuple[str, ...] = ()
    env: Tuple[Tuple[str, str], ...] = ()
    pieces: Dict[str, str] = field(default_factory=dict)  # op -> what runs it (the results table)


def make_setups(moe_c: str = "marlin", extra_args: Optional[Dict[str, Sequence[str]]] = None,
                extra_env: Optional[Dict[str, Dict[str, str]]] = None) -> Dict[str, Setup]:
    """The three setups; ``extra_args`` / ``extra_env`` (setup key -> arguments / variables) are added after
    SETUP_EXTRA_ARGS / SETUP_EXTRA_ENV."""
    if moe_c not in ("marlin", "flashinfer_mxfp4"):
        raise ValueError(f"moe_c must be 'marlin' or 'flashinfer_mxfp4', got {moe_c!r}")
    for what, table in (("extra_args", extra_args), ("extra_env", extra_env)):
        bad = sorted(set(table or {}) - set(SETUP_KEYS))
        if bad:
            raise ValueError(f"{what}: setup keys must be among {SETUP_KEYS}, got {bad}")
    sm120_fallbacks = (("SGLANG_SM120_FLASHMLA_BACKEND", "triton"),)
    a = Setup(
        "a", "stock SGLang 0.5.17, SM120 paths", sm120_view=True, our_patch=False, moe_runner="marlin",
        server_args=("--moe-runner-backend", "marlin", "--fp8-gemm-backend", "triton"),
        env=sm120_fallbacks,
        pieces={
            "sparse_mla": "SGLang's Triton SM120 kernel (SGLANG_SM120_FLASHMLA_BACKEND=triton; its default, "
                          "FlashInfer's SM120 sparse MLA, is built for sm_120 only)",
            "indexer_logits": "SGLang's TileLang kernel (SGLang sets SGLANG_OPT_USE_TILELANG_INDEXER on SM120)",
            "hc_prenorm": "SGLang's non-DeepGEMM mHC path (SGLANG_OPT_DEEPGEMM_HC_PRENORM and TileLang mHC pre "
                          "off on SM120)",
            "moe": "SGLang's Marlin MXFP4 runner (--moe-runner-backend marlin; the SM120 default flashinfer_mxfp4 "
                   "is built for sm_120 only, and the triton runner cannot run MXFP4 experts)",
            "fp8_linear": "SGLang's Triton block-FP8 GEMM (--fp8-gemm-backend triton; the SM120 default, a JIT "
                          "CUTLASS kernel, is built for sm_120 only)",
        })
    b = Setup(
        "b", "SGLang 0.5.17, SM120 paths, with our patch", sm120_view=True, our_patch=True, moe_runner="triton",
        server_args=("--moe-runner-backend", "triton", "--fp8-gemm-backend", "triton"),
        env=sm120_fallbacks + (("DSV4_KERNEL_FORCE", "1"),),
        pieces={
            "sparse_mla": "ours (replaces flash_mla_with_kvcache_sm120, whose backend was Triton)",
            "indexer_logits": "ours (replaces the TileLang paged MQA logits)",
            "hc_prenorm": "ours (SGLANG_OPT_DEEPGEMM_HC_PRENORM set again in the workers; DeepGEMM's and SGLang's "
                          "wrapper's tf32_hc_prenorm_gemm replaced)",
            "moe": "ours (Fp8MoEMethod.apply on the triton runner)",
            "fp8_linear": "ours up to 64 rows (Fp8LinearMethod.apply), SGLang's Triton block-FP8 GEMM above; wo_a kept in "
                          "FP8 (SGLANG_OPT_FP8_WO_A_GEMM set again in the workers) with its grouped GEMM ours",
        })
    c_moe_args = ("--moe-runner-backend", moe_c)
    c = Setup(
        "c", "stock SGLang 0.5.17, native sm_90 paths (reference)", sm120_view=False, our_patch=False,
        moe_runner=moe_c, server_args=c_moe_args,
        env=(("SGLANG_JIT_DEEPGEMM_PRECOMPILE", "0"),),
        pieces={
            "sparse_mla": "FlashMLA (sgl_kernel.flash_mla)",
            "indexer_logits": "DeepGEMM fp8_paged_mqa_logits",
            "hc_prenorm": "SGLang's TileLang mHC pre (its sm90 default) and DeepGEMM tf32_hc_prenorm_gemm",
            "moe": ("SGLang's Marlin MXFP4 runner" if moe_c == "marlin"
                    else "FlashInfer CUTLASS MXFP4 W4A16 (sm90)"),
            "fp8_linear": "DeepGEMM",
        })
    out = {}
    for setup in (a, b, c):
        args = tuple(SETUP_EXTRA_ARGS.get(setup.key, ())) + tuple((extra_args or {}).get(setup.key, ()))
        env = dict(setup.env)
        env.update(dict(SETUP_EXTRA_ENV.get(setup.key, ())))
        env.update((extra_env or {}).get(setup.key, {}))
        out[setup.key] = replace(setup, server_args=setup.server_args + args, env=tuple(env.items()))
    return out


def default_variant(setup: Setup) -> Setup:
    """(b) "with default settings", as a user who only mounts build/dsv4 runs it: no --moe-runner-backend (SGLang's
    own SM120 default) and no DSV4_KERNEL_PREFER; --fp8-gemm-backend triton stays (the SM120 default, a JIT CUTLASS
    kernel, is built for sm_120 only and cannot run on the test GPU)."""
    if not setup.our_patch:
        raise ValueError(f"the default-settings variant is a setting of our patch (setup b), not of {setup.key}")
    args, skip = [], False
    for i, a in enumerate(setup.server_args):
        if skip:
            skip = False
            continue
        if a == "--moe-runner-backend":
            skip = True
            continue
        if a.startswith("--moe-runner-backend="):
            continue
        args.append(a)
    env = tuple((k, v) for k, v in setup.env if k != "DSV4_KERNEL_PREFER")
    pieces = dict(setup.pieces, moe="SGLang's SM120 default runner (no --moe-runner-backend), with what our patch "
                                    "does there by default")
    return replace(setup, title=setup.title + ", default settings", moe_runner="auto (SGLang's SM120 default)",
                   server_args=tuple(args), env=env, pieces=pieces)


def instruction_class(setup: Setup, native: bool = False) -> str:
    """'mma' (SM120's: no wgmma) for the SM120-view setups unless ``native``; 'native' for (c)."""
    return "mma" if setup.sm120_view and not native else "native"


def class_env(cls: str, cache_root: str) -> Dict[str, str]:
    """The instruction class's variables and its own kernel-cache directories (Triton, TorchInductor, TileLang)."""
    if cls not in CLASSES:
        raise ValueError(f"instruction class must be one of {CLASSES}, got {cls!r}")
    env = dict(MMA_CLASS_ENV) if cls == "mma" else {}
    env.update({"TRITON_CACHE_DIR": os.path.join(cache_root, cls, "triton"),
                "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_root, cls, "inductor"),
                "TILELANG_CACHE_DIR": os.path.join(cache_root, cls, "tilelang")})
    return env


@dataclass(frozen=True)
class Paths:
    """Directories on the GPU machine (all under the work dir except the repository's)."""
    work: str
    repo: str

    @property
    def site(self) -> str:
        return os.path.join(self.work, "site")

    @property
    def tf(self) -> str:
        return os.path.join(self.work, "tf")

    @property
    def dsv4(self) -> str:
        return os.path.join(self.work, "dsv4")

    @property
    def model(self) -> str:
        return os.path.join(self.work, "model")

    @property
    def shim(self) -> str:
        return os.path.join(self.repo, "tools", "e2e", "sm120_shim")

    @property
    def caches(self) -> str:
        """Kernel caches per instruction class (setups.class_env)."""
        return os.path.join(self.work, "cache")


def pythonpath(setup: Setup, paths: Paths) -> List[str]:
    """transformers/tokenizers first (the machine's transformers breaks SGLang 0.5.17), then the harness shim (every
    setup: it seeds the dummy weights; SM120 view only in a and b), build/dsv4 (b only), the bundle (with TileLang)."""
    entries = [paths.tf, paths.shim]
    if setup.our_patch:
        entries.append(paths.dsv4)
    entries.append(paths.site)
    return entries


# inherited variables that would decide what a server builds or runs: each setup sets its own
CLASS_VARIABLES = ("DISABLE_MMA_V3", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TILELANG_CACHE_DIR",
                   "TL_DISABLE_WGMMA")


def server_env(setup: Setup, paths: Paths, base_env: Dict[str, str], seed: int, weight_log: str,
               native: bool = False) -> Dict[str, str]:
    """The server's environment: the machine's, less every DSV4_* / SGLANG_* / instruction-class variable, then the
    harness's, the instruction class's (``native``: the test GPU's own class for an SM120-view setup) and the
    setup's."""
    env = {k: v for k, v in base_env.items() if not k.startswith(("DSV4_", "SGLANG_")) and k not in CLASS_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(pythonpath(setup, paths))
    env["PYTHONUNBUFFERED"] = "1"
    env["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off on the test machines (KINDS.md)
    env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    env["NVSHMEM_DISABLE_NVLS"] = "1"
    env["SGLANG_DSV4_FP4_EXPERTS"] = "1"  # MXFP4 routed experts (also the default; set: skips the safetensors probe)
    env["DSV4_E2E_WEIGHT_SEED"] = str(seed)
    env["DSV4_E2E_WEIGHT_LOG"] = weight_log
    if setup.sm120_view:
        env["DSV4_E2E_SM120_VIEW"] = "1"
    env.update(class_env(instruction_class(setup, native), paths.caches))
    env.update(dict(setup.env))
    return env


def server_command(setup: Setup, paths: Paths, *, port: int, tp: int = 1, cuda_graphs: bool = True,
                   mtp: bool = False, context_length: int = 70000, max_running: int = 64,
                   cuda_graph_max_bs: int = 32, mem_fraction: float = 0.7, seed: int = 0,
                   max_total_tokens: Optional[int] = None, python: str = "python3") -> List[str]:
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    cmd = [python, "-m", "sglang.launch_server",
           "--model-path", paths.model, "--load-format", "dummy", "--skip-tokenizer-init",
           "--host", "127.0.0.1", "--port", str(port), "--tp-size", str(tp),
           "--context-length", str(context_length), "--max-running-requests", str(max_running),
           "--mem-fraction-static", str(mem_fraction), "--random-seed", str(seed), "--log-level", "info"]
    if max_total_tokens is not None:  # servers that share one GPU: each KV pool capped, not sized from free memory
        cmd += ["--max-total-tokens", str(max_total_tokens)]
    cmd += list(setup.server_args)
    if cuda_graphs:  # SGLang's default graph backends; capture only the batch sizes the harness measures (each
        # captured size costs start-up time; other batch sizes pad to the next captured one)
        sizes = [bs for bs in (1, 8, cuda_graph_max_bs) if bs <= cuda_graph_max_bs]
        cmd += ["--cuda-graph-max-bs-decode", str(cuda_graph_max_bs),
                "--cuda-graph-bs-decode", *[str(bs) for bs in sorted(set(sizes))]]
    else:  # what --disable-cuda-graph stands for in 0.5.17 (a deprecated alias of these, server_args.py:8333)
        cmd += ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    if mtp:
        # EAGLE with the MTP layer as draft; DeepSeek-V4 allows EAGLE with topk 1 only (deepseek_v4_hook.py:149-157)
        cmd += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
                "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2"]
    return cmd


def session_name(setup_key: str, cuda_graphs: bool, mtp: bool, native: bool = False) -> str:
    return f"{setup_key}-{'graphs' if cuda_graphs else 'eager'}{'-mtp' if mtp else ''}{'-native' if native else ''}"
