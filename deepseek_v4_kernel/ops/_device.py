"""Device facts the ops size their grids with, read once per device (no query on the hot path, so
calls stay CUDA-graph safe)."""
import functools

import torch


# The newest Triton the version-dependent choices were measured under on a GPU (H100: 3.9, torch 2.15.0's pin;
# H100: 3.8, SGLang 0.5.23's). The doctor says when the installed one is newer: its choices are then extrapolated.
NEWEST_CHECKED_TRITON = (3, 9)


@functools.lru_cache(maxsize=None)
def triton_version() -> tuple:
    """(major, minor) of the installed Triton, which JIT-compiles the Triton kernels on the user's GPU (each SGLang
    image's torch pins it: 3.6 up to SGLang 0.5.17, 3.8 in 0.5.23; torch 2.15 pins 3.9). Some launch choices were
    measured per version (ops/hc_prenorm.presplit_allowed, ops/fp4_moe.default_impl); versions newer than the last one
    measured take the choice that did not regress there (NEWEST_CHECKED_TRITON)."""
    import triton

    parts = []
    for piece in triton.__version__.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


_TRITON_TRUE = ("1", "true", "yes", "on", "y")   # Triton's own boolean words (libtriton getBoolEnv, 3.6)


def triton_env_flag(name: str) -> bool:
    """A boolean variable that Triton itself reads (TRITON_INTERPRET, DISABLE_MMA_V3), read as Triton reads it, so
    that our choices agree with what Triton does: its own parser where it exports one (triton._C.libtriton
    .getenv_bool: 1 / true / yes / on / y in any case), else those words. TRITON_INTERPRET=true runs the
    interpreter in Triton, so it must here too (only "1" was accepted by fp4_moe)."""
    try:
        from triton._C.libtriton import getenv_bool
    except ImportError:
        getenv_bool = None
    if getenv_bool is not None:
        return bool(getenv_bool(name, False))
    import os

    return os.environ.get(name, "").lower() in _TRITON_TRUE


def triton_interpret() -> bool:
    """Whether Triton runs our kernels in its interpreter (on the CPU's tensors): TRITON_INTERPRET as Triton reads it."""
    return triton_env_flag("TRITON_INTERPRET")


def check_kernel_device(op: str, **tensors) -> None:
    """Each tensor on a CUDA device, or any device under the Triton interpreter (TRITON_INTERPRET=1): else Triton
    fails with "0 active drivers" or a pointer error that names no argument. Raises UnsupportedCase naming the
    argument, the expected device and the device found."""
    if triton_interpret():
        return
    from ..errors import UnsupportedCase

    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device.type != "cuda":
            raise UnsupportedCase(f"{op}: {name} must be on a CUDA device (or run with TRITON_INTERPRET=1 for the "
                                  f"Triton interpreter), got a tensor on {t.device}")


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Number of SMs of a CUDA device (its index, or the current device when it has none)."""
    return _sm_count_of(_index(device))


# Shared memory per SM (KB) by compute capability, where torch does not report it (CUDA programming guide, table of
# technical specifications): sm_80 164, sm_86 / sm_89 100, sm_90 / sm_100 228, sm_120 100.
_SMEM_PER_SM_KB = {(8, 0): 164, (8, 6): 100, (8, 7): 164, (8, 9): 100, (9, 0): 228, (10, 0): 228, (10, 3): 228,
                   (12, 0): 100, (12, 1): 100}


@functools.lru_cache(maxsize=None)
def _smem_per_sm_kb_of(index: int) -> float:
    props = torch.cuda.get_device_properties(index)
    got = getattr(props, "shared_memory_per_multiprocessor", None)
    if isinstance(got, int) and got > 0:
        return got / 1024
    return float(_SMEM_PER_SM_KB.get((props.major, props.minor), 0))


def smem_per_sm_kb(device: torch.device) -> float:
    """Shared memory per SM of a CUDA device in KB (0 when unknown: callers then take their small-memory choice)."""
    return _smem_per_sm_kb_of(_index(device))


@functools.lru_cache(maxsize=None)
def _extension_error_of(index: int):
    from .. import _ext

    lib = _ext.load()  # ExtensionUnavailable propagates (not cached: the next call looks again)
    if not hasattr(lib, "dsv4_device_supported"):  # a library built before the check existed
        return None
    with torch.cuda.device(index):
        rc = lib.dsv4_device_supported()
    if rc == 0:
        return None
    major, minor = torch.cuda.get_device_capability(index)
    return (f"{_ext.lib_path()} has no kernel for GPU {index} ({torch.cuda.get_device_name(index)}, "
            f"sm_{major}{minor}): built for {', '.join(_ext.built_archs())} ({_ext.last_error()}); rebuild "
            f"with DSV4_KERNEL_EXTRA_ARCHS={major}{minor}a scripts/build.sh to add it (kernels untested there)")


def extension_error(device: torch.device):
    """None when the compiled extension loads and has kernels this CUDA device can run; else why not (a
    GPU arch the library was not built for: sm_120a code runs on compute capability 12.0 only). Asked once
    per device, so it stays off the hot path. Raises ExtensionUnavailable when the library does not load."""
    return _extension_error_of(_index(device))


def on_input_device(op):
    """Decorator for an op entry point: run it with the CUDA device of its first argument (a tensor) as the
    current device. Triton launches a kernel on the current device and its current stream, not on the
    device of the tensors: in a process that drives several GPUs (one SGLang worker makes its own GPU
    current, a script or test may not), a call on cuda:1 while cuda:0 is current would run on the wrong
    GPU. The compiled ops set the device around their launch the same way. No cost when the device is
    already current (the usual case)."""
    import inspect

    first = next(iter(inspect.signature(op).parameters))

    @functools.wraps(op)
    def run(*args, **kwargs):
        t = args[0] if args else kwargs.get(first)
        if isinstance(t, torch.Tensor) and t.is_cuda and t.device.index != torch.cuda.current_device():
            with torch.cuda.device(t.device):
                return op(*args, **kwargs)
        return op(*args, **kwargs)

    return run
