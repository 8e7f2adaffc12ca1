"""What the end-to-end bundle holds: the Python packages SGLang 0.5.17 needs on the GPU test machine beyond what its
image already has (H200, Python 3.12, torch 2.11.0+cu130, triton 3.6.0; /work/shared/specs/e2e_bundle.md), pinned.

Three groups, each one xz tarball split into parts that fit one device call:
* ``base``: SGLang 0.5.17 and what its server / DeepSeek-V4 import chains need; unpacked into ``site/``.
* ``tilelang``: TileLang and what its compiler loads. Unpacked into the SAME ``site/``: libtilelang's RUNPATH is
  ``$ORIGIN/../../tvm_ffi/lib:$ORIGIN/../../z3/lib``, so tvm_ffi (base) and z3/lib must sit beside tilelang/.
  Every setup needs it in 0.5.17: the native path's first forward runs ``mhc_pre_big_fuse_with_norm_tilelang``; on
  SM120, server_args.py:5314 sets SGLANG_OPT_USE_TILELANG_INDEXER and ``mhc_post`` stays on TileLang
  (SGLANG_OPT_USE_TILELANG_MHC_POST is not turned off there); our patch replaces the TileLang indexer function, whose
  module imports tilelang. It is a separate group only so that it can be carried in its own call.
* ``tf``: transformers 5.12.1 + tokenizers 0.22.2, unpacked into ``tf/``, first on PYTHONPATH: the machine's
  transformers 5.17.0 breaks SGLang 0.5.17 ("'qwen3_asr' is already used by a Transformers config").

Left out because the machine has them (KINDS.md "Python packages already there"): torch, triton, torchvision 0.26.0,
numpy, safetensors, huggingface-hub, aiohttp, requests, psutil, pillow, anyio, httpx, h11, click, attrs, uvloop,
sentencepiece, tiktoken, einops, ninja, msgpack, xxhash, prometheus-client, pyyaml, pygments, tqdm, packaging,
cuda-bindings. ``run_e2e.py prepare`` imports the critical ones and stops with their names if one is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

MIB = 2 ** 20
# One device call carries at most 64 MiB of working tree; the repository itself is ~1.5 MiB. Parts stay at or under
# this size, and a call's transfer (several parts) stays at or under TRANSFER_LIMIT.
PART_LIMIT = 56 * MIB
TRANSFER_LIMIT = 60 * MIB

PYTHON_TAG = "3.12"
ABI = "cp312"
# pip matches manylinux tags exactly, so every tag a pinned wheel may carry is listed.
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (5, 12, 17, 24, 26, 27, 28, 31, 34)) + (
    "manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64", "any")

# group -> directory (under the GPU machine's work dir) it unpacks into
GROUP_DEST: Dict[str, str] = {"base": "site", "tilelang": "site", "tf": "tf"}
GROUP_ORDER = ("base", "tf", "tilelang")


@dataclass(frozen=True)
class Package:
    name: str  # distribution name, as pip takes it
    version: str
    group: str
    exclude: Tuple[str, ...] = ()  # fnmatch patterns of wheel members left out
    only: Tuple[str, ...] = ()  # if set: the only members kept (fnmatch patterns)
    strip_debug: Tuple[str, ...] = ()  # members run through `strip --strip-debug`
    note: str = ""

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


PACKAGES: Tuple[Package, ...] = (
    # --- SGLang and its kernels ------------------------------------------------------------------------------------
    Package("sglang", "0.5.17", "base"),
    Package("sglang-kernel", "0.4.5", "base",
            exclude=("sgl_kernel/flash_ops*.so", "sgl_kernel/infllm_ops*", "sgl_kernel/sm100/*"),
            note="flash_ops (FlashAttention-3, 1.1 GB) is loaded only by sgl_kernel.flash_attn, which SGLang imports "
                 "inside functions DeepSeek-V4 does not call; infllm_ops loads lazily; sm100/common_ops is the library "
                 "for non-sm90 GPUs (the H200 loads sm90/common_ops)"),
    Package("flashinfer-python", "0.6.15.post1", "base"),
    Package("sgl-deep-gemm", "0.1.5.post1", "base"),
    Package("apache-tvm-ffi", "0.1.11", "base"),
    Package("xgrammar", "0.2.1", "base", exclude=("xgrammar/lib/libxgrammar.a",),
            strip_debug=("xgrammar/libxgrammar_bindings.so",)),
    # --- the HTTP server and SGLang's module-level imports -------------------------------------------------------
    Package("fastapi", "0.140.13", "base", note="0.145+ imports opentelemetry"),
    Package("starlette", "0.52.1", "base"),
    Package("uvicorn", "0.54.0", "base"),
    Package("python-multipart", "0.0.34", "base", note="the server defines Form/File routes"),
    Package("pydantic", "2.14.4", "base"),
    Package("pydantic-core", "2.50.5", "base"),
    Package("annotated-types", "0.8.0", "base"),
    Package("typing-inspection", "0.4.5", "base"),
    Package("typing-extensions", "4.16.0", "base"),
    Package("orjson", "3.13.0", "base"),
    Package("msgspec", "0.22.0", "base"),
    Package("pyzmq", "27.3.0", "base"),
    Package("pybase64", "1.5.1", "base"),
    Package("setproctitle", "1.3.8", "base"),
    Package("partial-json-parser", "0.2.1.1.post7", "base"),
    Package("openai", "2.6.1", "base"),
    Package("jiter", "0.19.0", "base"),
    Package("distro", "1.9.0", "base"),
    Package("sniffio", "1.3.1", "base"),
    Package("jsonschema", "4.26.0", "base"),
    Package("jsonschema-specifications", "2025.9.1", "base"),
    Package("referencing", "0.37.0", "base"),
    Package("rpds-py", "2026.9.1", "base"),
    Package("soundfile", "0.13.1", "base"),
    Package("cffi", "2.1.1", "base"),
    Package("pycparser", "3.12", "base"),
    Package("compressed-tensors", "0.20.1", "base"),
    Package("loguru", "0.7.3", "base"),
    Package("gguf", "0.19.0", "base"),
    Package("dill", "0.4.1", "base"),
    # IPython: imported by sglang.utils, via sglang/__init__
    Package("ipython", "9.18.1", "base"),
    Package("ipython-pygments-lexers", "1.1.1", "base"),
    Package("jedi", "0.20.1", "base"),
    Package("parso", "0.8.7", "base"),
    Package("prompt-toolkit", "3.0.53", "base"),
    Package("wcwidth", "0.9.4", "base"),
    Package("traitlets", "5.16.1", "base"),
    Package("decorator", "5.3.1", "base"),
    Package("matplotlib-inline", "0.2.2", "base"),
    Package("pexpect", "4.9.0", "base"),
    Package("ptyprocess", "0.7.0", "base"),
    Package("stack-data", "0.6.3", "base"),
    Package("executing", "2.3.0", "base"),
    Package("asttokens", "3.0.2", "base"),
    Package("pure-eval", "0.2.4", "base"),
    # --- transformers pinned by SGLang 0.5.17 (first on the path) --------------------------------------------------
    Package("transformers", "5.12.1", "tf"),
    Package("tokenizers", "0.22.2", "tf", note="SGLang's bound is <=0.23.0"),
    # --- TileLang (same site dir as base) ----------------------------------------------------------------------------
    Package("tilelang", "0.1.11", "tilelang"),
    Package("torch-c-dlpack-ext", "0.1.5", "tilelang"),
    Package("z3-solver", "4.15.4.0", "tilelang", only=("z3/lib/libz3.so.4.15",),
            note="only the library libtilelang links (tilelang 0.1.11 needs z3-solver<4.15.5)"),
)


def packages_in(group: str) -> Tuple[Package, ...]:
    return tuple(p for p in PACKAGES if p.group == group)


def normalise(name: str) -> str:
    """PEP 503 name: what wheel file names and dist-info directories use after lower-casing."""
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def spec_problems() -> list:
    out = []
    seen = set()
    for p in PACKAGES:
        key = normalise(p.name)
        if key in seen:
            out.append(f"{p.name} listed twice (one version of each package: two stop an install)")
        seen.add(key)
        if p.group not in GROUP_DEST:
            out.append(f"{p.name}: group {p.group!r} is not one of {sorted(GROUP_DEST)}")
        if p.exclude and p.only:
            out.append(f"{p.name}: give exclude or only, not both")
    return out
