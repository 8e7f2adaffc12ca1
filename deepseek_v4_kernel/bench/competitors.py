"""Every other implementation of our ops that can run in this process: SGLang's own paths (TileLang, Triton, torch,
FlashInfer) and DeepSeek's native kernels (FlashMLA, DeepGEMM), each behind one call form per op, for the bench.

``discover(op)`` lists them all, runnable or not (``reason`` says why not: not installed, another GPU class, not
compiled, ...); it never raises. A competitor's ``prepare(inputs)`` takes the op's inputs (below, built by the bench
from our reference packers) and returns a zero-argument call that launches the work and returns its result; shape-
only set-up (scheduling metadata, weight layouts SGLang prepares at load time) happens in ``prepare``, outside the
timed call. ``prepare`` raises ``NotApplicable`` for a shape the competitor's SGLang call site never sends it.

Inputs per op (every tensor on the GPU):
  sparse_decode   q [b,1,h,512] bf16; k_cache [pages,256,1,584] (SGLang's SWA pages, stride rounded to 576 B);
                  indices [b,1,128] int32; topk_length [b]; extra_k_cache [pages,64,1,584]; extra_indices
                  [b,1,extra]; extra_topk_length [b]; attn_sink [h] fp32  -> out [b,1,h,512] bf16
  indexer_logits  q [b,1,64,128] e4m3; kv_cache [blocks,64,1,132] uint8; weights [b,64] fp32; seq_lens [b] int32;
                  page_table [b,pages] int32; max_seq_len  -> logits [b, >= max_seq_len] fp32 (t < seq_lens)
  hc_prenorm      x [m,K] bf16; fn [n,K] fp32; num_splits None or S  -> (out [S',m,>=n], sqrsum [S',m]): partial
                  sums over K slices in any count S' (the caller of each path sums them)
  fp8_linear      x [M,K] bf16; weight [N,K] e4m3; weight_scale [N/128,K/128] fp32  -> y [M,N] bf16
  fp4_moe         x [M,H] bf16; w13 uint8 [E,2I,H/2] (gate rows, then up); w13_scale uint8 UE8M0 [E,2I,H/32];
                  w2 uint8 [E,H,I/2]; w2_scale [E,H,I/32]; topk_weights [M,k] fp32; topk_ids [M,k] int32;
                  swiglu_limit  -> out [M,H] bf16 (routed scaling left out)

With our patch active in this process, SGLang's or DeepGEMM's attribute may be our replacement: the original
(``__dsv4_original__``) is what is timed. SGLang's kernels are loaded from its source files (bench/sources.py).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..patch import policy

OPS = ("sparse_decode", "indexer_logits", "hc_prenorm", "fp4_moe", "fp8_linear")
SGLANG, NATIVE = "sglang", "native"   # roles: a path SGLang may run for the op; DeepSeek's own kernel (reference)

# SGLang files per kernel, newest layout first (0.5.16 moved the kernels to sglang/kernels)
FILES = {
    "flash_mla_sm120_triton": ("sglang/kernels/ops/attention/flash_mla_sm120_triton.py",
                               "sglang/srt/layers/attention/flash_mla_sm120_triton.py"),
    "flash_mla_sm120": ("sglang/kernels/ops/attention/flash_mla_sm120.py",
                        "sglang/srt/layers/attention/flash_mla_sm120.py"),
    "tilelang_indexer": ("sglang/kernels/ops/attention/dsa/tilelang_kernel.py",
                         "sglang/srt/layers/attention/dsa/tilelang_kernel.py",
                         "sglang/srt/layers/attention/dsv4/tilelang_kernel.py"),
    "indexer": ("sglang/srt/layers/attention/dsv4/indexer.py",),
    "mhc": ("sglang/kernels/ops/layernorm/mhc.py",),
    "triton_moe": ("sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py",
                   "sglang/srt/layers/moe/fused_moe_triton/fused_moe.py"),
}
TILELANG_INDEXER_NAMES = ("pass_configs", "_is_hip", "_is_fp8_fnuz", "BF16", "FP8", "FP8_DTYPE", "FP32", "INT32",
                          "UINT8", "fp8_paged_mqa_logits_kernel", "tilelang_fp8_paged_mqa_logits")
MHC_SPLITK = "mhc_pre_gemm_sqrsum_splitk_kernel"
MHC_ONE_SPLIT = "mhc_pre_gemm_sqrsum_tilelang"
MHC_SPLITS_PRE = 32        # mhc_pre's n_splits_pre (0.5.17 / 0.5.23 deepseek_v4.py pass the default)
MHC_SPLITK_MAX_M = 2048    # mhc_pre runs the split-K kernel up to this many tokens, the one-split kernel above
TORCH_BUDGET_BYTES = 16 << 30   # a torch fallback that would allocate more is not timed


class NotApplicable(Exception):
    """The competitor's SGLang call site never sends it this shape (the message says why)."""


@dataclass
class Competitor:
    op: str
    name: str
    origin: str                     # the module / file / package it comes from
    role: str                       # SGLANG or NATIVE
    prepare: Optional[Callable[[Dict[str, Any]], Callable[[], Any]]] = None
    reason: str = ""                # why it cannot run here ("" when it can)
    same_as: str = ""               # the name of an earlier competitor with the identical kernel source

    @property
    def runnable(self) -> bool:
        return self.prepare is not None and not self.reason and not self.same_as


def _original(fn):
    """SGLang's / DeepGEMM's own function where our patch layer replaced it in this process."""
    return getattr(fn, "__dsv4_original__", None) or fn


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _capability() -> Tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)


def _gpu_text(cap: Tuple[int, int]) -> str:
    return f"this GPU is sm_{cap[0]}{cap[1]}" if cap[0] else "no CUDA GPU here"


def _sm_count() -> int:
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _flashinfer_jit_blocker(spec_fn: str, allow_jit: bool) -> str:
    """"" when FlashInfer's JIT module ``spec_fn`` is built (AOT or JIT cache) or building is allowed, else why not."""
    if allow_jit:
        return ""
    try:
        gen = getattr(importlib.import_module("flashinfer.jit.fused_moe"), spec_fn)
        if gen(False).is_compiled:
            return ""
    except Exception as e:  # noqa: BLE001
        return f"cannot tell whether FlashInfer's {spec_fn} is built ({_why(e)}); pass --allow-jit to try"
    return f"FlashInfer would JIT-compile {spec_fn} first (minutes); pass --allow-jit to include it"


# ----------------------------------------------------------------------------- sparse decode
def _sparse_decode(trees, mma_sync, allow_jit) -> List[Competitor]:
    from . import sources

    out, seen = [], {}
    for version, tree in trees:
        path = sources.find_file(tree, FILES["flash_mla_sm120_triton"])
        c = Competitor("sparse_decode", f"sglang-{version} triton flash_mla_sm120 fallback", path or tree, SGLANG)
        try:
            if path is None:
                raise LookupError(f"SGLang {version} has no flash_mla_sm120_triton.py")
            if not _seen_before(c, seen, open(path).read()):
                spec = importlib.util.spec_from_file_location(f"dsv4_sglang_{version.replace('.', '_')}_fmla_triton",
                                                              path)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)   # torch + triton only
                c.prepare = _triton_sparse_decode(mod.flash_mla_sparse_decode_triton)
        except Exception as e:  # noqa: BLE001
            c.reason = _why(e)
        out.append(c)
        path = sources.find_file(tree, FILES["flash_mla_sm120"])
        c = Competitor("sparse_decode", f"sglang-{version} torch flash_mla_sm120 fallback", path or tree, SGLANG)
        try:
            if path is None:
                raise LookupError(f"SGLang {version} has no flash_mla_sm120.py")
            names = ["_NOPE_DIM", "_ROPE_DIM", "_NOPE_ROPE_STRIDE", "_TILE_SIZE", "_NUM_TILES", "_SCALE_STRIDE", "_D",
                     "_gather_and_dequant", "_sm120_sparse_decode_fwd"]
            if not _seen_before(c, seen, ast_dump(path, names)):
                c.prepare = _torch_sparse_decode(sources.load(path, names)["_sm120_sparse_decode_fwd"])
        except Exception as e:  # noqa: BLE001
            c.reason = _why(e)
        out.append(c)
    out.append(_flashinfer_sparse_mla())
    out.append(_flashmla_native())
    return out


def ast_dump(path: str, names) -> str:
    from . import sources

    return "".join(sources.definition_dump(path, n) for n in names)


def _seen_before(c: Competitor, seen: Dict[str, str], key: str) -> bool:
    """Mark ``c`` as the same kernel as an earlier version's (identical source): timed once."""
    if key in seen:
        c.same_as = seen[key]
        return True
    seen[key] = c.name
    return False


def _sm_scale(q):
    return q.shape[-1] ** -0.5   # SGLang's dispatcher, for softmax_scale None


def _triton_sparse_decode(fn):
    def prepare(a):
        def call():
            return fn(a["q"], a["k_cache"], a["indices"], a["topk_length"], a["attn_sink"], 512, _sm_scale(a["q"]),
                      a["extra_k_cache"], a["extra_indices"], a["extra_topk_length"])[0]
        return call
    return prepare


def _torch_sparse_decode(fn):
    def prepare(a):
        b, _, h, _ = a["q"].shape
        slots = a["indices"].shape[-1] + a["extra_indices"].shape[-1]
        need = b * slots * 512 * 4 * 3 + b * h * slots * 4 * 3   # gathered bf16 -> fp32 copies, scores, weights
        if need > TORCH_BUDGET_BYTES:
            raise NotApplicable(f"would allocate ~{need / 2**30:.0f} GiB")

        def call():
            return fn(a["q"], a["k_cache"], a["indices"], a["topk_length"], a["attn_sink"], 512, _sm_scale(a["q"]),
                      a["extra_k_cache"], a["extra_indices"], a["extra_topk_length"])[0]
        return call
    return prepare


def _flashinfer_sparse_mla() -> Competitor:
    from ..patch.targets import TARGETS

    c = Competitor("sparse_decode", "flashinfer sm120 sparse mla (sglang dispatcher, 256->64 page split included)",
                   "flashinfer.mla._sparse_mla_sm120", SGLANG)
    cap = _capability()
    if cap[0] != 12:
        c.reason = f"FlashInfer's sparse MLA kernel is SM120-only; {_gpu_text(cap)}"
        return c
    try:
        importlib.import_module("flashinfer.mla._sparse_mla_sm120")
        errors = []
        for name in [t.module for t in reversed(TARGETS) if t.attr == "flash_mla_with_kvcache_sm120"]:
            try:
                mod = importlib.import_module(name)
            except ImportError as e:
                errors.append(_why(e))
                continue
            fn = _original(mod._flash_mla_flashinfer)   # SGLang's own FlashInfer path, page-split copy included
            c.origin = f"{name}._flash_mla_flashinfer"

            def prepare(a, fn=fn):
                def call():
                    return fn(a["q"], a["k_cache"], a["indices"], a["topk_length"], a["attn_sink"], 512,
                              _sm_scale(a["q"]), a["extra_k_cache"], a["extra_indices"], a["extra_topk_length"])[0]
                return call
            c.prepare = prepare
            return c
        c.reason = "no SGLang SM120 dispatcher importable: " + "; ".join(errors)
    except Exception as e:  # noqa: BLE001
        c.reason = _why(e)
    return c


def _flashmla_native() -> Competitor:
    c = Competitor("sparse_decode", "flashmla native (sgl_kernel)", "sgl_kernel.flash_mla", NATIVE)
    try:
        try:
            mod = importlib.import_module("sgl_kernel.flash_mla")
        except ImportError:
            mod = importlib.import_module("flash_mla")
            c.name, c.origin = "flashmla native (flash_mla)", "flash_mla"
        fwd, meta = _original(mod.flash_mla_with_kvcache), mod.get_mla_metadata
    except Exception as e:  # noqa: BLE001
        c.reason = _why(e)
        return c
    schedules: Dict[tuple, Any] = {}

    def prepare(a):
        import torch

        # one lazily initialised schedule per call shape, as SGLang keeps one per batch (get_mla_metadata())
        key = (tuple(a["q"].shape), a["extra_indices"].shape[-1], a["k_cache"].shape[1])
        if key not in schedules:
            schedules[key] = meta()[0]
        sched = schedules[key]
        # FlashMLA takes the caches as e4m3 tensors (the same bytes; views made outside the timed call)
        k_cache, extra = a["k_cache"].view(torch.float8_e4m3fn), a["extra_k_cache"].view(torch.float8_e4m3fn)

        def call():
            return fwd(a["q"], k_cache, None, None, 512, sched, None, _sm_scale(a["q"]), False,
                       is_fp8_kvcache=True, indices=a["indices"], attn_sink=a["attn_sink"],
                       extra_k_cache=extra, extra_indices_in_kvcache=a["extra_indices"],
                       topk_length=a["topk_length"], extra_topk_length=a["extra_topk_length"])[0]
        return call
    c.prepare = prepare
    return c


# ----------------------------------------------------------------------------- indexer logits
def _indexer(trees, mma_sync, allow_jit) -> List[Competitor]:
    from . import sources

    out, seen = [], {}
    for version, tree in trees:
        path = sources.find_file(tree, FILES["tilelang_indexer"])
        c = Competitor("indexer_logits", f"sglang-{version} tilelang_fp8_paged_mqa_logits", path or tree, SGLANG)
        try:
            if path is None:
                raise LookupError(f"SGLang {version} has no TileLang indexer file")
            dump = sources.definition_dump(path, "fp8_paged_mqa_logits_kernel")
            if dump in seen:
                c.same_as = seen[dump]
            else:
                ns = sources.load(path, TILELANG_INDEXER_NAMES, needs_tilelang=True, sm120=mma_sync,
                                  tilelang_forced=sources.wgmma_off_configs() if mma_sync else None)
                fn = ns["tilelang_fp8_paged_mqa_logits"]
                seen[dump] = c.name   # (after a successful load: a later identical kernel would fail alike)

                def prepare(a, fn=fn):
                    def call():   # SGLang's call site: positional, 1-D seq_lens for TileLang, clean_logits False
                        return fn(a["q"], a["kv_cache"], a["weights"], a["seq_lens"], a["page_table"], None,
                                  a["max_seq_len"], False)
                    return call
                c.prepare = prepare
        except Exception as e:  # noqa: BLE001
            c.reason = _why(e)
        out.append(c)
        path = sources.find_file(tree, FILES["indexer"])
        c = Competitor("indexer_logits", f"sglang-{version} torch fp8_paged_mqa_logits_torch_sm120", path or tree,
                       SGLANG)
        try:
            if path is None:
                raise LookupError(f"SGLang {version} has no dsv4/indexer.py")
            if _seen_before(c, seen, ast_dump(path, ["fp8_paged_mqa_logits_torch_sm120"])):
                out.append(c)
                continue
            fn = sources.load(path, ["fp8_paged_mqa_logits_torch_sm120"])["fp8_paged_mqa_logits_torch_sm120"]

            def prepare(a, fn=fn):
                b, pages = a["q"].shape[0], -(-a["max_seq_len"] // 64)
                need = b * pages * 64 * (132 + 2 * 128 + 4 * 64 * 2 + 8)   # gather, bf16 K, scores
                if need > TORCH_BUDGET_BYTES:
                    raise NotApplicable(f"would allocate ~{need / 2**30:.0f} GiB")
                lens2 = a["seq_lens"][:, None]   # SGLang 0.5.17 passes [b, 1] to the torch path

                def call():
                    return fn(a["q"], a["kv_cache"], a["weights"], lens2, a["page_table"], None, a["max_seq_len"],
                              False)
                return call
            c.prepare = prepare
        except Exception as e:  # noqa: BLE001
            c.reason = _why(e)
        out.append(c)
    c = Competitor("indexer_logits", "deep_gemm fp8_paged_mqa_logits", "deep_gemm", NATIVE)
    try:
        dg = importlib.import_module("deep_gemm")
        fwd, meta = _original(dg.fp8_paged_mqa_logits), dg.get_paged_mqa_logits_metadata

        def prepare(a):
            lens2 = a["seq_lens"][:, None].contiguous()   # DeepGEMM: context_lens [b, next_n]
            sched = meta(lens2, 64, _sm_count())         # once per batch in SGLang's metadata, not per layer

            def call():
                return fwd(a["q"], a["kv_cache"], a["weights"], lens2, a["page_table"], sched, a["max_seq_len"], False)
            return call
        c.prepare = prepare
    except Exception as e:  # noqa: BLE001
        c.reason = _why(e)
    out.append(c)
    return out


# ----------------------------------------------------------------------------- hc_prenorm
def _hc_prenorm(trees, mma_sync, allow_jit) -> List[Competitor]:
    from . import sources

    out, seen = [], {}
    for version, tree in trees:
        path = sources.find_file(tree, FILES["mhc"])
        for kernel in (MHC_SPLITK, MHC_ONE_SPLIT):
            label = (f"tilelang {kernel} (split {MHC_SPLITS_PRE}, mhc_pre up to {MHC_SPLITK_MAX_M} rows)"
                     if kernel == MHC_SPLITK else f"tilelang {kernel} (one split: mhc_pre above {MHC_SPLITK_MAX_M}"
                                                  f" rows, the fused post/pre step above 32)")
            c = Competitor("hc_prenorm", f"sglang-{version} {label}", path or tree, SGLANG)
            try:
                if path is None:
                    raise LookupError(f"SGLang {version} has no kernels/ops/layernorm/mhc.py")
                names = [kernel, "pass_configs"]
                if kernel == MHC_ONE_SPLIT and "_mhc_pre_gemm_sqrsum_dispatch" in open(path).read():
                    names.append("_mhc_pre_gemm_sqrsum_dispatch")   # 0.5.23: SM120 re-jits it, WS off
                dump = "".join(sources.definition_dump(path, n) for n in names if n != "pass_configs")
                if dump in seen:
                    c.same_as = seen[dump]
                    out.append(c)
                    continue
                ns = sources.load(path, names, needs_tilelang=True, sm120=mma_sync,
                                  tilelang_forced=sources.wgmma_off_configs() if mma_sync else None)
                seen[dump] = c.name
                c.prepare = _tilelang_splitk(ns[kernel]) if kernel == MHC_SPLITK else _tilelang_one_split(
                    ns["_mhc_pre_gemm_sqrsum_dispatch"]() if "_mhc_pre_gemm_sqrsum_dispatch" in ns else ns[kernel])
            except Exception as e:  # noqa: BLE001
                c.reason = _why(e)
            out.append(c)
    c = Competitor("hc_prenorm", "sglang torch hc_pre path (replica: F.linear fp32 + square-sum)", "torch", SGLANG)
    c.prepare = _torch_hc_pre
    out.append(c)
    c = Competitor("hc_prenorm", "deep_gemm tf32_hc_prenorm_gemm", "deep_gemm", NATIVE)
    try:
        fn = _original(importlib.import_module("deep_gemm").tf32_hc_prenorm_gemm)

        def prepare(a):
            import torch

            x, w, s = a["x"], a["fn"], a["num_splits"]
            shape = (x.shape[0],) if s is None else (s, x.shape[0])

            def call():
                out_ = torch.empty(*shape, w.shape[0], dtype=torch.float32, device=x.device)
                sq = torch.empty(*shape, dtype=torch.float32, device=x.device)
                fn(x, w, out_, sq, num_splits=s)
                return out_, sq
            return call
        c.prepare = prepare
    except Exception as e:  # noqa: BLE001
        c.reason = _why(e)
    out.append(c)
    return out


def _hidden_block(K: int) -> int:
    if K == 16384:
        return 256
    if K == 28672:
        return 128
    raise NotApplicable(f"SGLang's mhc_pre takes K 16384 or 28672 only, got {K}")


def _tilelang_splitk(factory):
    def prepare(a):
        import torch

        x, w = a["x"], a["fn"]
        m, K = x.shape
        if m > MHC_SPLITK_MAX_M:
            raise NotApplicable(f"mhc_pre runs it up to {MHC_SPLITK_MAX_M} rows")
        kernel_0, _ = factory(w.shape[0], K, split_k=MHC_SPLITS_PRE, token_block=32, hidden_block=_hidden_block(K))

        def call():   # as mhc_pre: partials [32, m, 32] reduced later inside its big-fuse kernel
            po = torch.empty(MHC_SPLITS_PRE, m, 32, dtype=torch.float32, device=x.device)
            ps = torch.empty(MHC_SPLITS_PRE, m, dtype=torch.float32, device=x.device)
            kernel_0(x, w, po, ps)
            return po, ps
        return call
    return prepare


def _tilelang_one_split(kernel):
    def prepare(a):
        import torch

        x, w = a["x"], a["fn"]
        m, K = x.shape
        _hidden_block(K)

        def call():
            out_ = torch.empty(m, w.shape[0], dtype=torch.float32, device=x.device)
            sq = torch.empty(m, dtype=torch.float32, device=x.device)
            kernel(x, w, out_, sq, w.shape[0], K)
            return out_[None], sq[None]
        return call
    return prepare


def _torch_hc_pre(a):
    x, w = a["x"], a["fn"]

    def call():   # deepseek_v4.py hc_pre_torch_impl: x.float(), F.linear, mean of squares
        import torch.nn.functional as F

        xf = x.float()
        return F.linear(xf, w)[None], xf.square().sum(-1)[None]
    return call


# ----------------------------------------------------------------------------- fp4 MoE
def triton_moe_blocker(tree: str) -> str:
    """Why SGLang's Triton MoE runner cannot run DeepSeek-V4's MXFP4 experts, read off its source (the assert that
    stops it), or "" where that source has no such check."""
    from . import sources

    path = sources.find_file(tree, FILES["triton_moe"])
    if path is None:
        return ""
    for i, line in enumerate(open(path), 1):
        if "Hidden size mismatch" in line:
            return (f"its fused_experts asserts hidden_states.shape[1] == w1.shape[2] ('Hidden size mismatch', "
                    f"{path}:{i}); MXFP4 experts hold hidden/2 bytes per row")
    return ""


def _fp4_moe(trees, mma_sync, allow_jit) -> List[Competitor]:
    out = []
    for version, tree in trees:
        c = Competitor("fp4_moe", f"sglang-{version} triton MoE runner", tree, SGLANG)
        c.reason = triton_moe_blocker(tree) or "no MXFP4 path in SGLang's Triton MoE runner to time"
        out.append(c)
    c = Competitor("fp4_moe", "flashinfer cutlass mxfp4 moe (sglang flashinfer_mxfp4: W4A16 sm_90, W4A8 SM120)",
                   "flashinfer.fused_moe.cutlass_fused_moe", SGLANG)
    cap = _capability()
    if cap[0] not in (9, 12):
        c.reason = f"SGLang runs FlashInfer's CUTLASS MXFP4 MoE on sm_90 and SM120 only; {_gpu_text(cap)}"
    else:
        try:
            importlib.import_module("flashinfer.fused_moe")
            c.reason = _flashinfer_jit_blocker("gen_cutlass_fused_moe_sm120_module" if cap[0] == 12
                                               else "gen_cutlass_fused_moe_sm90_module", allow_jit)
            if not c.reason:
                c.prepare = _flashinfer_mxfp4(sm120=cap[0] == 12)
        except Exception as e:  # noqa: BLE001
            c.reason = _why(e)
    out.append(c)
    return out


def _flashinfer_mxfp4(sm120: bool):
    """SGLang's Mxfp4FlashinferCutlassMoEMethod (0.5.17): its weight preparation (process_weights_after_loading:
    [up; gate] rows, then interleaved scales on SM120 or interleaved weights and scales on sm_90) once per weight
    set, and its call (fused_experts_none_to_flashinfer_mxfp4) per forward."""
    import torch

    prepared: Dict[int, tuple] = {}

    def weights(a):
        key = id(a["w13"])
        if key not in prepared:
            prepared.clear()   # one weight set at a time (they are GiBs)
            inter = a["w13"].shape[1] // 2
            w13 = torch.cat([a["w13"][:, inter:], a["w13"][:, :inter]], 1).contiguous()   # [up; gate]
            s13 = torch.cat([a["w13_scale"][:, inter:], a["w13_scale"][:, :inter]], 1).contiguous()
            w2, s2 = a["w2"].contiguous(), a["w2_scale"].contiguous().clone()
            E = w13.shape[0]
            if sm120:
                from flashinfer import block_scale_interleave

                for s in (s13, s2):
                    s.copy_(block_scale_interleave(s).reshape_as(s))
                scales = [s13.view(torch.int32), torch.ones(E, dtype=torch.float32, device=w13.device),
                          s2.view(torch.int32), torch.ones(E, dtype=torch.float32, device=w13.device)]
                w13, w2 = w13.view(torch.int64), w2.view(torch.int64)
            else:
                from flashinfer.fused_moe import (interleave_moe_scales_for_sm90_mixed_gemm,
                                                  interleave_moe_weights_for_sm90_mixed_gemm)

                w13 = interleave_moe_weights_for_sm90_mixed_gemm(w13, "fp4")
                w2 = interleave_moe_weights_for_sm90_mixed_gemm(w2, "fp4")
                scales = [interleave_moe_scales_for_sm90_mixed_gemm(s13, group_size=32).view(torch.int32),
                          interleave_moe_scales_for_sm90_mixed_gemm(s2, group_size=32).view(torch.int32)]
            limit = torch.full((E,), float(a["swiglu_limit"]), dtype=torch.float32, device=w13.device)
            prepared[key] = (w13, w2, scales, limit)
        return prepared[key]

    def prepare(a):
        from flashinfer import mxfp8_quantize
        from flashinfer.fused_moe import ActivationType, cutlass_fused_moe

        w13, w2, scales, limit = weights(a)
        x, ids, tw = a["x"], a["topk_ids"].to(torch.int32), a["topk_weights"]
        tune = 1 << max(0, (x.shape[0] - 1).bit_length())

        def call():
            xin, sf = mxfp8_quantize(x, is_sf_swizzled_layout=True, alignment=32) if sm120 else (x, None)
            out_ = torch.empty(x.shape[0], x.shape[1], dtype=torch.bfloat16, device=x.device)
            cutlass_fused_moe(input=xin, token_selected_experts=ids, token_final_scales=tw, fc1_expert_weights=w13,
                              fc2_expert_weights=w2, output_dtype=torch.bfloat16, quant_scales=scales, input_sf=sf,
                              swiglu_limit=limit, use_w4_group_scaling=not sm120, use_mxfp8_act_scaling=sm120,
                              activation_type=ActivationType.Swiglu, tune_max_num_tokens=tune, output=out_)
            return out_
        return call
    return prepare


# ----------------------------------------------------------------------------- discovery
@dataclass
class Discovery:
    """What a competitor provider gets: the SGLang source trees to load kernels from ((version, directory)), the
    build mode, and (where the caller knows them) the device and the cases it will time."""
    op: str
    trees: List[Tuple[str, str]]
    mma_sync: bool = False
    allow_jit: bool = False
    device: Any = None
    cases: Tuple[Any, ...] = ()


def _builtin(builder):
    return lambda d: builder(d.trees, d.mma_sync, d.allow_jit)


# The competitor providers per op: each takes a Discovery and returns Competitors (runnable or with a reason).
# Another module adds its own with register(op, provider), e.g. (bench/moe_competitors.py):
#     register("fp4_moe", lambda d: moe_competitors(d.device, d.cases))
PROVIDERS: Dict[str, List[Callable[[Discovery], List[Competitor]]]] = {
    "sparse_decode": [_builtin(_sparse_decode)], "indexer_logits": [_builtin(_indexer)],
    "hc_prenorm": [_builtin(_hc_prenorm)], "fp4_moe": [_builtin(_fp4_moe)],
    "fp8_linear": [lambda d: importlib.import_module(__package__ + ".fp8_competitors").fp8_linear_competitors(d)],
}


def register(op: str, provider: Callable[[Discovery], List[Competitor]]) -> None:
    """Add a competitor provider for ``op`` (a new op gets its own list)."""
    PROVIDERS.setdefault(op, [])
    if provider not in PROVIDERS[op]:
        PROVIDERS[op].append(provider)


def discover(op: str, *, mma_sync: bool = False, source_versions=(), allow_jit: bool = False, device=None,
             cases=()) -> List[Competitor]:
    """Every competitor of ``op`` for this process and GPU (see the module docstring); never raises for a
    competitor's failure (its ``reason`` says it). ``source_versions``: SGLang versions to load from unpacked
    sources besides the installed one; ``mma_sync``: build TileLang kernels as on SM120 (no wgmma)."""
    if op not in PROVIDERS:
        raise ValueError(f"op must be one of {', '.join(PROVIDERS)}, got {op!r}")
    from . import sources

    trees = sources.source_trees(source_versions)
    d = Discovery(op, trees, mma_sync, allow_jit, device, tuple(cases))
    found: List[Competitor] = []
    for provider in PROVIDERS[op]:
        try:
            found += list(provider(d))
        except Exception as e:  # noqa: BLE001  (a bug in one provider costs its competitors, not the run)
            found.append(Competitor(op, f"{op} competitors ({getattr(provider, '__qualname__', provider)})",
                                    "deepseek_v4_kernel.bench.competitors", SGLANG,
                                    reason=f"discovery failed: {_why(e)}"))
    missing = [v for v in source_versions if v not in {t[0] for t in trees}]
    for v in missing:
        found.append(Competitor(op, f"sglang-{v} (sources)", sources.SOURCES_ENV, SGLANG,
                                reason=f"no unpacked SGLang {v} under {sources.SOURCES_ENV} or .sglang"))
    return found


def sglang_default(op: str, names: List[str], sglang_version: Optional[str]) -> Tuple[Optional[str], str]:
    """Which of the competitors ``names`` is the original at our patched call site (what a hand-back runs, and what
    SGLang runs there when the op is not patched), and why. Whether it runs on this GPU is the bench's to measure."""
    import os

    v = policy.parse_version(sglang_version) if sglang_version else ()
    tag = f"sglang-{sglang_version} "

    def pick(prefix, text=""):
        return next((n for n in names if n.startswith(prefix) and text in n), None)

    if op == "sparse_decode":
        backend = os.environ.get("SGLANG_SM120_FLASHMLA_BACKEND", "flashinfer" if v >= (0, 5, 16) else "triton")
        if backend == "flashinfer":
            return pick("flashinfer sm120"), "SGLang's SM120 dispatcher runs FlashInfer's kernel by default"
        return pick(tag, f"{backend} flash_mla_sm120"), f"SGLang's SM120 dispatcher: SGLANG_SM120_FLASHMLA_BACKEND={backend}"
    if op == "indexer_logits":
        if v >= (0, 5, 16):
            return pick(tag, "tilelang"), "SGLang >= 0.5.16 sets its TileLang indexer on SM120"
        return pick(tag, "torch"), "SGLang < 0.5.16 runs its torch fallback on SM120 (our env row selects it)"
    if op == "hc_prenorm":
        return pick("deep_gemm"), "the patched call site is DeepGEMM's prenorm GEMM (no SM120 kernel)"
    if op == "fp8_linear":
        return (next((n for n in names if n.endswith("(Fp8LinearMethod's resolved backend)")), None),
                "Fp8LinearMethod.apply runs the block-FP8 function --fp8-gemm-backend resolved to (its own "
                "activation quantization included)")
    return pick(tag, "triton MoE runner"), "the patched call site is Fp8MoEMethod.apply on SGLang's Triton MoE runner"
