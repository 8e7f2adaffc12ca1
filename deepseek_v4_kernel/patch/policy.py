"""What the patch layer may do in this process: environment switches, device, SGLang version.

Nothing here imports torch, SGLang or initialises CUDA: the device is read through NVML
(libnvidia-ml, the driver's management library), which creates no CUDA context, so a
process that forks workers after start-up is not harmed. The probe runs when the patch layer
installs (sitecustomize.py: when SGLang is first imported), never in a process that does not.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import List, Optional, Tuple


def env_flag(name: str) -> bool:
    """A boolean switch, read by the one parser (deepseek_v4_kernel/switches.py): a value it does not accept raises
    InvalidSwitch naming the variable (the start-up hook then says so in one line and installs nothing)."""
    from ..switches import env_bool

    return env_bool(name, False)


# Switches (documented in the README).
DISABLE = "DSV4_KERNEL_DISABLE"  # 1: install nothing at all
FORCE = "DSV4_KERNEL_FORCE"  # 1: act on any CUDA GPU (testing on H100)
PREFER = "DSV4_KERNEL_PREFER"  # which kernel runs per op and size class: PREFER_MODES
STRICT = "DSV4_KERNEL_STRICT"  # 1: an uncovered case raises instead of handing back
QUIET = "DSV4_KERNEL_QUIET"  # 1: no start-up line
# Set by the patch layer itself, never by users: the environment variables it set because the user had not (comma
# separated). Processes started later inherit it, so a reasserting env row can tell SGLang's launcher's value from
# the user's (patch/hook.py, Patcher._apply_env).
ENV_SET = "DSV4_KERNEL_ENV_SET"


# DSV4_KERNEL_PREFER's values: "measured" (the default, also when unset): ours against SGLang's kernels timed on this
# GPU at the server's first start, per size class (patch/decisions.py); "ours": ours everywhere, SGLang's native SM120
# kernels included; "builtin": the project's own keep rules (measured on an H200, patch/measured.BUILTIN_KEEP), no
# timing at start-up.
PREFER_MODES = ("measured", "ours", "builtin")


def prefer_mode() -> str:
    """DSV4_KERNEL_PREFER, read by the one parser: unset or empty is "measured"; a value outside PREFER_MODES raises
    InvalidSwitch naming the variable and the accepted values (the start-up hook then installs nothing and says so)."""
    from ..switches import env_choice

    return env_choice(PREFER, PREFER_MODES, "measured")


def prefer_ours() -> bool:
    return prefer_mode() == "ours"


def strict() -> bool:
    return env_flag(STRICT)


@dataclass
class DeviceInfo:
    capabilities: List[Tuple[int, int]] = field(default_factory=list)
    names: List[str] = field(default_factory=list)
    source: str = "none"  # "nvml", "torch" or "none"
    error: Optional[str] = None
    driver: Optional[str] = None  # NVML's driver version ("580.95.05")
    cores: List[Optional[int]] = field(default_factory=list)  # CUDA cores per GPU (NVML; None where it cannot say)

    @property
    def has_sm12x(self) -> bool:
        return any(major == 12 for major, _ in self.capabilities)

    def describe(self) -> str:
        if not self.capabilities:
            return "no GPU visible to NVML" + (f": {self.error}" if self.error else "")
        caps = sorted({f"sm_{a}{b}" for a, b in self.capabilities})
        return f"{len(self.capabilities)} GPU(s) {', '.join(caps)} ({self.names[0]})"


def _visible_indices(count: int) -> List[int]:
    """Indices NVML should look at, read from CUDA_VISIBLE_DEVICES as CUDA reads it: entries in order, up to the
    first invalid one (CUDA_VISIBLE_DEVICES=-1 or "" hides every GPU; "0,9,1" on two GPUs is GPU 0 only); UUIDs
    and MIG names, which this probe cannot map to indices, make it look at every GPU."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is None:
        return list(range(count))
    out: List[int] = []
    for tok in vis.split(","):
        tok = tok.strip()
        if tok.startswith(("GPU-", "MIG-")):
            return list(range(count))
        if not re.fullmatch(r"\d+", tok) or int(tok) >= count or int(tok) in out:
            break
        out.append(int(tok))
    return out


def _nvml_error(nvml, code: int) -> str:
    """NVML's own words for a return code ("Driver Not Loaded", "Insufficient Permissions", ...)."""
    import ctypes

    try:
        nvml.nvmlErrorString.restype = ctypes.c_char_p
        return f"{nvml.nvmlErrorString(code).decode(errors='replace')} (NVML error {code})"
    except Exception:
        return f"NVML error {code}"


def _query_nvml() -> DeviceInfo:
    import ctypes

    info = DeviceInfo(source="nvml")
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        info.error = f"libnvidia-ml.so.1 not loadable: {e}"
        return info
    ret = nvml.nvmlInit_v2()
    if ret != 0:
        info.error = f"nvmlInit_v2 failed: {_nvml_error(nvml, ret)}"
        return info
    try:
        count = ctypes.c_uint(0)
        ret = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        if ret != 0:
            info.error = f"nvmlDeviceGetCount_v2 failed: {_nvml_error(nvml, ret)}"
            return info
        drv = ctypes.create_string_buffer(96)
        if nvml.nvmlSystemGetDriverVersion(drv, 96) == 0:
            info.driver = drv.value.decode(errors="replace")
        for i in _visible_indices(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                continue
            major, minor = ctypes.c_int(0), ctypes.c_int(0)
            if nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) != 0:
                continue
            name = ctypes.create_string_buffer(96)
            nvml.nvmlDeviceGetName(handle, name, 96)
            info.capabilities.append((major.value, minor.value))
            info.names.append(name.value.decode(errors="replace"))
            cores = ctypes.c_uint(0)
            get_cores = getattr(nvml, "nvmlDeviceGetNumGpuCores", None)   # (drivers from 2022 on)
            info.cores.append(cores.value if get_cores is not None and get_cores(handle, ctypes.byref(cores)) == 0
                              else None)
    finally:
        nvml.nvmlShutdown()
    return info


_DEVICE: Optional[DeviceInfo] = None


def device_info() -> DeviceInfo:
    """The GPUs this process will see (cached). Never initialises CUDA."""
    global _DEVICE
    if _DEVICE is None:
        try:
            _DEVICE = _query_nvml()
        except Exception as e:  # never let a probe break start-up
            _DEVICE = DeviceInfo(source="nvml", error=repr(e))
    return _DEVICE


def active() -> Tuple[bool, str]:
    """Whether patches apply in this process, and why (one phrase)."""
    if env_flag(DISABLE):
        return False, f"disabled by {DISABLE}=1"
    prefer_mode()   # an unknown DSV4_KERNEL_PREFER stops the install here, naming the variable and its values
    dev = device_info()
    if dev.has_sm12x:
        return True, f"SM12x device: {dev.describe()}"
    if env_flag(FORCE):
        return True, f"forced by {FORCE}=1 on {dev.describe()}"
    return False, f"no SM12x device ({dev.describe()}); set {FORCE}=1 to patch anyway"


def sglang_version() -> Optional[str]:
    """Installed SGLang version from package metadata (does not import SGLang)."""
    try:
        from importlib import metadata

        return metadata.version("sglang")
    except Exception:
        return None


def parse_version(v: str) -> Tuple[int, ...]:
    """'0.5.15.post1' -> (0, 5, 15, 1); '0.5.23rc0' -> (0, 5, 23, -1). Enough to order SGLang releases."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+)|(rc|a|b|dev)\d*)?", v)
    if not m:
        return ()
    base = tuple(int(x) for x in m.group(1, 2, 3))
    if m.group(4) is not None:
        return base + (int(m.group(4)),)
    if m.group(5) is not None:
        return base + (-1,)
    return base + (0,)
