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


# The exact wheel of each package, by file name and sha256: ``pip download`` of name==version alone may pick another
# build of the same version (another manylinux tag: apache-tvm-ffi 0.1.11 has two) and change the bundle's bytes.
# build_bundle.py asks pip for exactly this file (a hashed requirement) and refuses any other. Read from the wheels of
# the bundle built on 2026-12-02 (tools/e2e/bundle_manifest.json).
WHEELS: Dict[str, Tuple[str, str]] = {
    "sglang": ("sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl",
              "fb4cba478a5dca5ee146550b39f33add1c4e475d21ee11810b86ed1c58068093"),
    "sglang-kernel": ("sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl",
                     "5927a14dfff92ced8b1f7c7d5844144bc574ec58e604d4fd53e6f53c709003a8"),
    "flashinfer-python": ("flashinfer_python-0.6.15.post1-py3-none-any.whl",
                         "f2419fd2b77c2705816e8d0a31c784c6456b17f373f8494b5cfc3bdf434d5c44"),
    "sgl-deep-gemm": ("sgl_deep_gemm-0.1.5.post1-py3-none-manylinux2014_x86_64.whl",
                     "1ee11f78218082fcdf6779c1bf4e45eaa7d667fb099db96e29b716be701ea493"),
    "apache-tvm-ffi": ("apache_tvm_ffi-0.1.11-cp312-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
                      "78aa1857b04a2ea718317041ab3f01288b3d496e6036eb1b99ebdc9da0fdaef5"),
    "xgrammar": ("xgrammar-0.2.1-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
                "cbc6014dc1c92fc317b14519121c8163fe35fd934179e5a45d83f780ff231826"),
    "fastapi": ("fastapi-0.140.13-py3-none-any.whl",
               "8b017110e1e9f30a95e8bdb8f71fbe2f0fe3af5717109e5b14f9e069df54f6d4"),
    "starlette": ("starlette-0.52.1-py3-none-any.whl",
                 "0029d43eb3d273bc4f83a08720b4912ea4b071087a3b48db01b7c839f7954d74"),
    "uvicorn": ("uvicorn-0.54.0-py3-none-any.whl",
               "505bdb0f318731d45f1f712071fc781a8981f6847a31c902c9f5e652d4f67faf"),
    "python-multipart": ("python_multipart-0.0.34-py3-none-any.whl",
                        "ebacd224bd686eee2f9aa1066a657affe07435a185834e05e5235e2e59173e91"),
    "pydantic": ("pydantic-2.14.4-py3-none-any.whl",
                "653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc"),
    "pydantic-core": ("pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
                     "470bbc2495367f60d3ca849a8039e4c164701d10637e7743f4427d92651bdb6d"),
    "annotated-types": ("annotated_types-0.8.0-py3-none-any.whl",
                       "f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0"),
    "typing-inspection": ("typing_inspection-0.4.5-py3-none-any.whl",
                         "bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39"),
    "typing-extensions": ("typing_extensions-4.16.0-py3-none-any.whl",
                         "481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8"),
    "orjson": ("orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
              "bceadfd314bd238f584fc229a4bbaf0e573597e7a026dec5429fbf29fd66c641"),
    "msgspec": ("msgspec-0.22.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",
               "99c401861c5bb3a57f7d6423ea7ed4352cd57aa3f04f4fbe9f3e3e4564a10f08"),
    "pyzmq": ("pyzmq-27.3.0-cp312-abi3-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl",
             "858fe25231e0fd8612da142efde019faa5ef63fa150a821a27870e791b38c798"),
    "pybase64": ("pybase64-1.5.1-cp312-cp312-manylinux1_x86_64.manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_5_x86_64.whl",
                "c212d02fd072c5845d39b4699eb65efa827b79a5cf7fecc9f468f8cad2b8540f"),
    "setproctitle": ("setproctitle-1.3.8-cp312-cp312-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl",
                    "4a765e0c80a2453480be27c4fc22ba1c0771867040c5f91e4221940d78a4abfb"),
    "partial-json-parser": ("partial_json_parser-0.2.1.1.post7-py3-none-any.whl",
                           "145119e5eabcf80cbb13844a6b50a85c68bf99d376f8ed771e2a3c3b03e653ae"),
    "openai": ("openai-2.6.1-py3-none-any.whl",
              "904e4b5254a8416746a2f05649594fa41b19d799843cd134dac86167e094edef"),
    "jiter": ("jiter-0.19.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
             "0956b5f58b804221dfb929c120e6d4032138fed20c1cc0ef683a2d1326255e46"),
    "distro": ("distro-1.9.0-py3-none-any.whl",
              "7bffd925d65168f85027d8da9af6bddab658135b840670a223589bc0c8ef02b2"),
    "sniffio": ("sniffio-1.3.1-py3-none-any.whl",
               "2f6da418d1f1e0fddd844478f41680e794e6051915791a034ff65e5f100525a2"),
    "jsonschema": ("jsonschema-4.26.0-py3-none-any.whl",
                  "d489f15263b8d200f8387e64b4c3a75f06629559fb73deb8fdfb525f2dab50ce"),
    "jsonschema-specifications": ("jsonschema_specifications-2025.9.1-py3-none-any.whl",
                                 "98802fee3a11ee76ecaca44429fda8a41bff98b00a0f2838151b113f210cc6fe"),
    "referencing": ("referencing-0.37.0-py3-none-any.whl",
                   "381329a9f99628c9069361716891d34ad94af76e461dcb0335825aecc7692231"),
    "rpds-py": ("rpds_py-2026.9.1-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
               "addeda51556dac7c1a2f14cda62db8b621cd12afba3091d03a96c72932387eab"),
    "soundfile": ("soundfile-0.13.1-py2.py3-none-manylinux_2_28_x86_64.whl",
                 "03267c4e493315294834a0870f31dbb3b28a95561b80b134f0bd3cf2d5f0e618"),
    "cffi": ("cffi-2.1.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            "c1453022f490d2459a11819d83ad1d586e9ff65a12ac3e705ffebd46d3685dcf"),
    "pycparser": ("pycparser-3.12-py3-none-any.whl",
                 "a076f3f489b39b43ed13563a1dafe42447445bec2e294154ec5c57fcdda4c85e"),
    "compressed-tensors": ("compressed_tensors-0.20.1-py3-none-any.whl",
                          "15307c904904219cafcb57d55f16b1bd6baf108d0421b65dfa79eece01672382"),
    "loguru": ("loguru-0.7.3-py3-none-any.whl",
              "31a33c10c8e1e10422bfd431aeb5d351c7cf7fa671e3c4df004162264b28220c"),
    "gguf": ("gguf-0.19.0-py3-none-any.whl",
            "70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd"),
    "dill": ("dill-0.4.1-py3-none-any.whl",
            "1e1ce33e978ae97fcfcff5638477032b801c46c7c65cf717f95fbc2248f79a9d"),
    "ipython": ("ipython-9.18.1-py3-none-any.whl",
               "997ce9140d374531a61069c70c0f9ef299d6dd3559ea0f94b8af589726e3c1d5"),
    "ipython-pygments-lexers": ("ipython_pygments_lexers-1.1.1-py3-none-any.whl",
                               "a9462224a505ade19a605f71f8fa63c2048833ce50abc86768a0d81d876dc81c"),
    "jedi": ("jedi-0.20.1-py2.py3-none-any.whl",
            "0fb16d86c4a4c73c37ba518c77419975e30fcc620658a8d14fbb5720cdd34142"),
    "parso": ("parso-0.8.7-py2.py3-none-any.whl",
             "a8926eb2a1b915486941fdbd31e86a4baf88fe8c210f25f2f35ecec5b574ca1c"),
    "prompt-toolkit": ("prompt_toolkit-3.0.53-py3-none-any.whl",
                      "01c0891d7f9237d5e339f7d3e42cdae80b7534abb1c7c0e3352efba6231492f2"),
    "wcwidth": ("wcwidth-0.9.4-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
               "b185c8b927b23af2721be1783499d1cfa5c028b098b0858951b4ae224477f1c2"),
    "traitlets": ("traitlets-5.16.1-py3-none-any.whl",
                 "f775618166caa0396c8e337099240f2bd3e5e917d203b2e6fbe21a58d3cb1f6b"),
    "decorator": ("decorator-5.3.1-py3-none-any.whl",
                 "f47fe6fdbd2edd623ecfe36875d37aba411624e2670dd395dddae1358689bb3c"),
    "matplotlib-inline": ("matplotlib_inline-0.2.2-py3-none-any.whl",
                         "3c821cf1c209f59fb2d2d64abbf5b23b67bcb2210d663f9918dd851c6da1fcf6"),
    "pexpect": ("pexpect-4.9.0-py2.py3-none-any.whl",
               "7236d1e080e4936be2dc3e326cec0af72acf9212a7e1d060210e70a47e253523"),
    "ptyprocess": ("ptyprocess-0.7.0-py2.py3-none-any.whl",
                  "4b41f3967fce3af57cc7e94b888626c18bf37a083e3651ca8feeb66d492fef35"),
    "stack-data": ("stack_data-0.6.3-py3-none-any.whl",
                  "d5558e0c25a4cb0853cddad3d77da9891a08cb85dd9f9f91b9f8cd66e511e695"),
    "executing": ("executing-2.3.0-py3-none-any.whl",
                 "736e859c9f8701f11fcf516856f26f562e04776387824b43a35a1dfe21c84122"),
    "asttokens": ("asttokens-3.0.2-py3-none-any.whl",
                 "9da13157f5b28becde0bd374fc677dcd3c290614264eff096f167c469cd9f933"),
    "pure-eval": ("pure_eval-0.2.4-py3-none-any.whl",
                 "96cae060a313cfaad51bb761278bfb0e62dc0248d9315a81173752dc546cd37a"),
    "transformers": ("transformers-5.12.1-py3-none-any.whl",
                    "2a5e109d2021265df7098ffbb738295acaf5ad256f12cbc586db2ea4dcbb1a8a"),
    "tokenizers": ("tokenizers-0.22.2-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                  "369cc9fc8cc10cb24143873a0d95438bb8ee257bb80c71989e3ee290e8d72c67"),
    "tilelang": ("tilelang-0.1.11-cp38-abi3-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
                "90d78f093d2bd46660633133982cd715cf9b7d0c379d463f136748efcfa55a9c"),
    "torch-c-dlpack-ext": ("torch_c_dlpack_ext-0.1.5-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
                          "e6f9da4bb9af70e27facc777458be62e10dbbbddda7672d16138db0553c5a524"),
    "z3-solver": ("z3_solver-4.15.4.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                 "7e103a6f203f505b8b8b8e5c931cc407c95b61556512d4921c1ddc0b3f41b08e"),
}


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
        pin = WHEELS.get(p.name)
        if pin is None:
            out.append(f"{p.name}: no pinned wheel in WHEELS (file name and sha256)")
        elif not (pin[0].endswith(".whl") and wheel_name_version(pin[0]) == (key, p.version)
                  and len(pin[1]) == 64 and all(c in "0123456789abcdef" for c in pin[1])):
            out.append(f"{p.name}: WHEELS pin {pin} is not a {p.requirement} wheel with a sha256")
    for name in sorted(set(WHEELS) - {p.name for p in PACKAGES}):
        out.append(f"WHEELS pins {name}, which PACKAGES does not list")
    return out


def wheel_name_version(filename: str) -> Tuple[str, str]:
    """(normalised distribution name, version) of a wheel file name."""
    dist, version = filename.split("-")[:2]
    return normalise(dist), version
