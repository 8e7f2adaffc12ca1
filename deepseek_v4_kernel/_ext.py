"""ctypes loader for the compiled C-ABI CUDA library ``deepseek_v4_kernel/_C.so``.

Built by ``scripts/build_ext.sh`` (plain nvcc, no torch headers), so one build works with
any torch / Python. Loaded lazily on first use and cached. ``DSV4_KERNEL_LIB`` overrides the path.
"""
import ctypes
import os
import struct
import threading
from typing import Optional

from .errors import ExtensionUnavailable

_LIB = None
_LOCK = threading.Lock()
_REFUSED = None   # ((path, size, mtime), elf_problem of that file): the last file the loader looked at


def lib_path() -> str:
    return os.environ.get("DSV4_KERNEL_LIB") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "_C.so")


_P = ctypes.c_void_p
_I = ctypes.c_int64


class SparseDecodeParams(ctypes.Structure):
    """Mirror of csrc/sparse_decode/params.h (every field 8 bytes; keep the order in sync)."""

    _fields_ = [
        ("q", _P), ("q_stride_b", _I), ("q_stride_s", _I), ("q_stride_h", _I),
        ("k_cache", _P), ("k_page_stride", _I), ("k_page_size", _I), ("k_num_pages", _I),
        ("indices", _P), ("idx_stride_b", _I), ("idx_stride_s", _I), ("idx_stride_k", _I), ("topk", _I),
        ("topk_length", _P), ("topk_length_stride", _I),
        ("extra_k_cache", _P), ("extra_page_stride", _I), ("extra_page_size", _I), ("extra_num_pages", _I),
        ("extra_indices", _P), ("extra_idx_stride_b", _I), ("extra_idx_stride_s", _I), ("extra_idx_stride_k", _I),
        ("extra_topk", _I),
        ("extra_topk_length", _P), ("extra_topk_length_stride", _I),
        ("attn_sink", _P),
        ("out", _P), ("lse", _P), ("o_part", _P), ("lse_part", _P),
        ("b", _I), ("s_q", _I), ("h_q", _I), ("num_splits", _I), ("split_tokens", _I),
        ("softmax_scale", ctypes.c_double),
        ("impl", _I), ("plain_launch", _I),
    ]


class Fp4MoeDecodeParams(ctypes.Structure):
    """Mirror of csrc/fp4_moe/params.h (every field 8 bytes; keep the order in sync)."""

    _fields_ = [
        ("x", _P), ("x_stride", _I),
        ("w13", _P), ("w13_stride_e", _I), ("w13_stride_n", _I),
        ("s13", _P), ("s13_stride_e", _I), ("s13_stride_n", _I), ("s13_f32", _I),
        ("w2", _P), ("w2_stride_e", _I), ("w2_stride_n", _I),
        ("s2", _P), ("s2_stride_e", _I), ("s2_stride_n", _I), ("s2_f32", _I),
        ("topk_ids", _P), ("ids_int64", _I),
        ("topk_weights", _P), ("tw_dtype", _I),
        ("h", _P), ("y", _P), ("counters", _P),
        ("out", _P), ("out_stride", _I),
        ("M", _I), ("topk", _I), ("E", _I), ("hidden", _I), ("inter", _I),
        ("swiglu", _I), ("swiglu_limit", ctypes.c_double), ("rsf", ctypes.c_double),
    ]


class Fp4MoeStreamParams(ctypes.Structure):
    """Mirror of csrc/fp4_moe/params.h Fp4MoeStreamParams (the decode block, then four 8-byte fields)."""

    _fields_ = [("d", Fp4MoeDecodeParams), ("wpi1", _I), ("wpi2", _I), ("variant", _I), ("blocks_per_sm", _I)]


class HcPrenormParams(ctypes.Structure):
    """Mirror of csrc/hc_prenorm/params.h (every field 8 bytes; keep the order in sync)."""

    _fields_ = [
        ("x", _P), ("x_stride", _I), ("fn", _P), ("fn_stride", _I),
        ("out", _P), ("out_stride_s", _I), ("out_stride_m", _I), ("out_stride_n", _I),
        ("sqrsum", _P), ("sq_stride_s", _I), ("sq_stride_m", _I),
        ("ws", _P), ("counters", _P),
        ("m", _I), ("n", _I), ("K", _I), ("num_splits", _I), ("sub_splits", _I), ("small_rows", _I),
        ("xchg", _P), ("fn_row_kernel", _I), ("atomic_sum", _I), ("mma_rows", _I), ("fn_groups", _I),
    ]


class Fp8LinearParams(ctypes.Structure):
    """Mirror of csrc/fp8_linear/params.h (every field 8 bytes; keep the order in sync)."""

    _fields_ = [
        ("x", _P), ("x_stride_m", _I), ("x_stride_g", _I),
        ("w", _P), ("w_stride_n", _I), ("w_stride_g", _I),
        ("scale", _P), ("s_stride_n", _I), ("s_stride_k", _I), ("s_stride_g", _I), ("scale_mode", _I),
        ("bias", _P), ("bias_stride_g", _I),
        ("out", _P), ("out_stride_m", _I), ("out_stride_g", _I),
        ("ws", _P), ("counters", _P),
        ("M", _I), ("N", _I), ("K", _I), ("G", _I), ("splits", _I), ("cvt_int", _I),
        ("kernel", _I), ("xf", _P),
    ]

_ELF_HEADER = 64     # bytes of an ELF64 file header
_PT_LOAD, _SHT_NOBITS = 1, 8


def elf_problem(path: str) -> Optional[str]:
    """Why the file at ``path`` is not a whole 64-bit ELF shared library, or None when its headers are consistent.
    Checked before dlopen: the loader maps the file's segments, and a page of a mapping that lies past the end of a
    truncated file (an interrupted copy, a full disk) raises SIGBUS at the first access, which kills the process
    without a message (the doctor and every SGLang worker alike). Reads only the headers (a few KB)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            hdr = f.read(_ELF_HEADER)
            if len(hdr) < _ELF_HEADER or hdr[:4] != b"\x7fELF":
                return f"not an ELF shared library ({size} bytes, starts with {hdr[:4]!r})"
            if hdr[4] != 2 or hdr[5] != 1:
                return "not a 64-bit little-endian ELF file"
            (e_type,) = struct.unpack_from("<H", hdr, 16)
            if e_type != 3:
                return f"not a shared library (ELF type {e_type}, expected 3, ET_DYN)"
            phoff, shoff = struct.unpack_from("<QQ", hdr, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", hdr, 54)
            need = max(phoff + phnum * phentsize, shoff + shnum * shentsize if shnum else 0)
            if need <= size:
                f.seek(phoff)
                ph = f.read(phnum * phentsize)
                for i in range(phnum):
                    p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", ph, i * phentsize)
                    if p_type == _PT_LOAD:
                        need = max(need, p_offset + p_filesz)
                if shnum:
                    f.seek(shoff)
                    sh = f.read(shnum * shentsize)
                    for i in range(shnum):
                        _, sh_type, _, _, sh_offset, sh_size = struct.unpack_from("<IIQQQQ", sh, i * shentsize)
                        if sh_type != _SHT_NOBITS:
                            need = max(need, sh_offset + sh_size)
    except (OSError, struct.error) as e:
        return f"unreadable ELF headers: {type(e).__name__}: {e}"
    if size < need:
        return (f"truncated: the file has {size} bytes, its ELF headers describe {need} (an interrupted copy or a "
                f"full disk?)")
    return None


def _bind(lib, path, op, params):
    """Types of the C entry ``dsv4_<op>(const Params*, stream)``; checks that the library's parameter
    block (``dsv4_<op>_params_size``) has the size of the ctypes mirror."""
    getattr(lib, f"dsv4_{op}_params_size").restype = ctypes.c_int
    fn = getattr(lib, f"dsv4_{op}")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(params), ctypes.c_void_p]
    size = getattr(lib, f"dsv4_{op}_params_size")()
    if size != ctypes.sizeof(params):
        raise ExtensionUnavailable(f"{path}: {params.__name__} size {size} != ctypes mirror "
                                   f"{ctypes.sizeof(params)} (stale build? rerun scripts/build_ext.sh)")


def load():
    """The loaded library (cached); raises ExtensionUnavailable with the path and dlopen error."""
    global _LIB
    if _LIB is not None:
        return _LIB
    with _LOCK:
        if _LIB is not None:
            return _LIB
        path = lib_path()
        if not os.path.exists(path):
            raise ExtensionUnavailable(f"deepseek_v4_kernel extension not built: {path} does not exist "
                                       f"(run scripts/build_ext.sh)")
        global _REFUSED
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime_ns)
        if _REFUSED is None or _REFUSED[0] != key:   # (the headers are read once per file version, not per call)
            _REFUSED = (key, elf_problem(path))
        why = _REFUSED[1]
        if why is not None:   # dlopen of such a file can kill the process (SIGBUS): refuse it here
            raise ExtensionUnavailable(f"cannot load {path}: {why}; rebuild with scripts/build.sh")
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise ExtensionUnavailable(f"cannot load {path}: {e}") from e
        lib.dsv4_last_error.restype = ctypes.c_char_p
        lib.dsv4_build_archs.restype = ctypes.c_char_p
        lib.dsv4_abi_version.restype = ctypes.c_int
        _bind(lib, path, "sparse_decode", SparseDecodeParams)
        # fp4_moe decode kernels (absent from libraries built before they existed: has_fp4_moe_decode())
        if hasattr(lib, "dsv4_fp4_moe_decode"):
            _bind(lib, path, "fp4_moe_decode", Fp4MoeDecodeParams)
        if hasattr(lib, "dsv4_fp4_moe_stream"):   # the streaming decode kernels: has_fp4_moe_stream()
            _bind(lib, path, "fp4_moe_stream", Fp4MoeStreamParams)
        if hasattr(lib, "dsv4_hc_prenorm"):   # likewise: has_hc_prenorm()
            _bind(lib, path, "hc_prenorm", HcPrenormParams)
        if hasattr(lib, "dsv4_fp8_linear"):   # likewise: has_fp8_linear()
            _bind(lib, path, "fp8_linear", Fp8LinearParams)
        _LIB = lib
        return lib


def has_fp4_moe_decode() -> bool:
    """The library loads and carries the fp4_moe decode kernels."""
    try:
        return hasattr(load(), "dsv4_fp4_moe_decode")
    except ExtensionUnavailable:
        return False


def has_fp4_moe_stream() -> bool:
    """The library loads and carries the fp4_moe streaming decode kernels (cuda_stream)."""
    try:
        return hasattr(load(), "dsv4_fp4_moe_stream")
    except ExtensionUnavailable:
        return False


def has_hc_prenorm() -> bool:
    """The library loads and carries the hc_prenorm GEMM kernel."""
    try:
        return hasattr(load(), "dsv4_hc_prenorm")
    except ExtensionUnavailable:
        return False


def has_fp8_linear() -> bool:
    """The library loads and carries the block-scaled FP8 linear decode kernel."""
    try:
        return hasattr(load(), "dsv4_fp8_linear")
    except ExtensionUnavailable:
        return False


def built_archs():
    """Archs the library was compiled for, e.g. ['sm_120a', 'sm_90a']."""
    return [a for a in load().dsv4_build_archs().decode().split(",") if a]


def last_error() -> str:
    return load().dsv4_last_error().decode(errors="replace")
