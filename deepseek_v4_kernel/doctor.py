"""``python -m deepseek_v4_kernel doctor [--json]``: what this machine has and what the patch would do.

Runs anywhere: without a GPU it reports what would happen; with one (SM12x, or any GPU with
DSV4_KERNEL_FORCE=1) it also runs a quick self-test of every op against its float64 reference.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
from typing import Optional

from . import __version__, switches
from .patch import policy

_DISTRIBUTIONS = {
    "torch": ("torch",),
    "triton": ("triton",),
    "sglang": ("sglang",),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "deep_gemm": ("deep-gemm", "deep_gemm", "sgl-deep-gemm"),
    "flash_mla": ("sgl-flash-mla", "flash-mla", "flash_mla"),
    "sgl_kernel": ("sgl-kernel", "sglang-kernel"),
}


def _dist_version(names) -> Optional[str]:
    from importlib import metadata

    for n in names:
        try:
            return metadata.version(n)
        except Exception:
            continue
    return None


def _torch_info() -> dict:
    try:
        import torch
    except Exception as e:
        return {"available": False, "error": f"torch not importable: {e!r}"}
    info = {"available": True, "version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": False}
    try:
        if torch.cuda.is_available():
            info["cuda_available"] = True
            cap = torch.cuda.get_device_capability()
            info["device"] = torch.cuda.get_device_name()
            info["capability"] = f"sm_{cap[0]}{cap[1]}"
            info["num_sms"] = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
            info["device_count"] = torch.cuda.device_count()
    except Exception as e:
        info["error"] = repr(e)
    return info


def _extension_info() -> dict:
    try:
        from . import _ext

        _ext.load()
        info = {"loads": True, "path": _ext.lib_path(), "archs": _ext.built_archs()}
    except Exception as e:
        return {"loads": False, "error": f"{type(e).__name__}: {e}"}
    try:
        import torch
    except ImportError as e:   # a build-only machine: no GPU check to make (not "no kernel")
        info["this_gpu"] = {"runs": None, "why": f"not checked: torch not installed ({e})"}
        return info
    try:  # can the current GPU run it (the ops ask the same once per device and hand back if not)
        if torch.cuda.is_available():
            from .ops._device import extension_error

            why = extension_error(torch.device("cuda", torch.cuda.current_device()))
            info["this_gpu"] = {"runs": why is None, "why": why}
    except Exception as e:
        info["this_gpu"] = {"runs": False, "why": f"check failed: {type(e).__name__}: {e}"}
    return info


def _targets(import_modules: bool) -> dict:
    """Install the patch layer here and, where asked, import each target module to see it patched."""
    from .patch import install, report

    try:
        patcher = install(announce=False)
    except Exception as e:  # noqa: BLE001 - e.g. InvalidSwitch of DSV4_KERNEL_FORCE: said, as the start-up line does
        return {"active": False, "why": f"not installed: {type(e).__name__}: {e}", "sglang": policy.sglang_version(),
                "targets": []}
    import_errors = {}
    if import_modules and patcher.active:
        for t in patcher.targets:
            rec = patcher.records[t]
            if rec.status != "pending" or t.kind == "env":
                continue
            try:
                importlib.import_module(t.module)
            except Exception as e:
                import_errors[t.module] = f"{type(e).__name__}: {e}"
        for t in patcher.targets:
            rec = patcher.records[t]
            if rec.status == "pending" and t.module in import_errors:
                rec.reason = f"module not importable here: {import_errors[t.module]}"
    rows = report()
    for t, row in zip(patcher.targets, rows):
        ok, why = t.applies_to_version(patcher.version)
        row["would"] = ("on an SM12x device: patched when its module is imported (after the checks)" if ok
                        else f"on an SM12x device: not applied ({why})")
    return {"active": patcher.active, "why": patcher.why, "sglang": patcher.version, "targets": rows}


_HC_ATOMIC_ENV = "DSV4_HC_PRENORM_ATOMIC"                           # ops/hc_prenorm/dispatch.py ATOMIC_ENV
_SGLANG_DETERMINISTIC_ENV = "SGLANG_ENABLE_DETERMINISTIC_INFERENCE"   # patch/adapters.py SGLANG_DETERMINISTIC_ENV


def _sums_info() -> str:
    """How hc_prenorm adds num_splits None's K sub-slices in this process (said, since atomics change the last bits
    between identical calls)."""
    try:
        from .ops.hc_prenorm import deterministic_sums
    except Exception as e:  # noqa: BLE001 - the doctor reports, never fails
        return f"unknown (hc_prenorm does not import: {type(e).__name__}: {e})"
    try:
        fixed = deterministic_sums()
    except Exception as e:  # noqa: BLE001 - a bad DSV4_HC_PRENORM_ATOMIC (said under "switches")
        return f"unknown ({type(e).__name__}: {e})"
    if fixed:
        return (f"fixed order ({_HC_ATOMIC_ENV}=0 or {_SGLANG_DETERMINISTIC_ENV} set): identical calls give "
                f"identical bits")
    return (f"float atomics for num_splits None's K sub-slices (the last bits may differ between identical calls; "
            f"{_HC_ATOMIC_ENV}=0 or SGLang's --enable-deterministic-inference: fixed order)")


def _triton_choices_info() -> str:
    """The launch choices that depend on the installed Triton (it JIT-compiles the Triton kernels; each SGLang image
    pins its own, 3.8 in 0.5.23): said, since they change which kernel a call runs."""
    try:
        from .ops import fp4_moe, hc_prenorm
        from .ops._device import NEWEST_CHECKED_TRITON, triton_version
        v = triton_version()
    except Exception as e:  # noqa: BLE001 - the doctor reports, never fails
        return f"unknown (the Triton ops do not import: {type(e).__name__}: {e})"
    name = ".".join(map(str, v))
    newest = ".".join(map(str, NEWEST_CHECKED_TRITON))
    measured = name if v <= NEWEST_CHECKED_TRITON else f"{newest}, the newest measured"
    said = []
    try:
        if not fp4_moe.decode_dequant_allowed():
            said.append(f"fp4_moe's decode regime runs dot_scaled, not dequant (slower under triton {measured})")
        if not hc_prenorm.presplit_allowed("wgmma"):
            said.append("hc_prenorm's Triton kernel splits fn per tile where Triton builds wgmma (sm_90; not "
                        "repeatable with presplit there)")
    except Exception as e:  # noqa: BLE001 - e.g. a bad switch value (said under "switches")
        return f"unknown ({type(e).__name__}: {e})"
    if not said:
        text = f"triton {name}: the defaults as measured"
    else:
        text = f"triton {name}: " + "; ".join(said) + " (docs/fp4_moe.md, docs/hc_prenorm.md: dispatch rules)"
    if v > NEWEST_CHECKED_TRITON:
        text += (f"; triton {name} is newer than the newest measured here ({newest}): these choices carry over, "
                 f"untimed and unchecked for repeatability under it")
    return text


_STARTED = "_deepseek_v4_kernel_startup"   # sitecustomize.py's sys.modules key: the copy of it that ran
_HOOK_MARKER = b"deepseek_v4_kernel start-up hook"


def _start_up_hook_info() -> str:
    """Whether our sitecustomize.py ran in this process, and if not, which one Python ran instead (Python imports
    only the first sitecustomize on sys.path: an image's own before ours means ours never runs)."""
    started = sys.modules.get(_STARTED)
    if started is not None:
        try:
            how = "installs nothing" if policy.env_flag(policy.DISABLE) else "installs the patch layer at the " \
                "first import of sglang, deep_gemm or flash_mla"
        except switches.InvalidSwitch as e:
            how = f"installs nothing: {e}"
        return f"ran ({getattr(started, '__file__', '?')}; {how})"
    first = getattr(sys.modules.get("sitecustomize"), "__file__", None)
    if not first:
        return "did not run: PYTHONPATH does not reach the directory that holds it (e.g. PYTHONPATH=build/dsv4)"
    try:
        with open(first, "rb") as f:
            ours = _HOOK_MARKER in f.read(256)
    except OSError:
        ours = False
    if ours:
        return f"an older copy ran ({first}): rebuild the directory with scripts/build.sh"
    return (f"did not run: Python ran {first}, the first sitecustomize.py on sys.path, and runs only that one: put "
            f"the directory that holds ours first on PYTHONPATH (ours then runs that one after it)")


def collect(run_selftest: bool = True, import_modules: bool = True, devices=None) -> dict:
    """``devices``: the GPUs to self-test ("cuda:N" strings; default every visible one)."""
    dev = policy.device_info()
    out = {
        "deepseek_v4_kernel": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "start_up_hook": _start_up_hook_info(),
        "nvml": {"gpus": [{"name": n, "capability": f"sm_{a}{b}"} for n, (a, b) in zip(dev.names, dev.capabilities)],
                 "error": dev.error},
        "versions": {k: _dist_version(v) for k, v in _DISTRIBUTIONS.items()},
        # every DSV4_* variable set (ours or a typo of one), and the others our ops read
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith("DSV4_") or k in (_SGLANG_DETERMINISTIC_ENV, "TRITON_INTERPRET", "DISABLE_MMA_V3")},
        # a value a switch's parser refuses: the patch layer installs nothing (DSV4_KERNEL_DISABLE / FORCE / STRICT /
        # QUIET) or the op that reads it hands its calls back to SGLang
        "switches": switches.problems(),
        "torch": _torch_info(),
        "extension": _extension_info(),
        "sums": _sums_info(),
        "triton_choices": _triton_choices_info(),
    }
    out["patch"] = _targets(import_modules)
    try:   # what python -m deepseek_v4_kernel bench measured here, and what DSV4_KERNEL_PREFER=measured would do
        from .patch import measured
        out["measured"] = measured.doctor_lines()
    except Exception as e:  # noqa: BLE001 - the doctor reports, never fails
        out["measured"] = [f"measured: not readable: {type(e).__name__}: {e}"]
    if run_selftest and out["torch"].get("cuda_available") and out["patch"]["active"]:
        from . import selftest

        out["selftest"] = selftest.run_all(devices)
    elif run_selftest:
        reason = ("no CUDA device" if not out["torch"].get("cuda_available")
                  else f"patch layer inactive ({out['patch']['why']})")
        out["selftest"] = {"skipped": reason}
    return out


def format_text(d: dict) -> str:
    lines = [f"deepseek_v4_kernel {d['deepseek_v4_kernel']}  (Python {d['python']}, {d['platform']})"]
    gpus = d["nvml"]["gpus"]
    if d.get("start_up_hook"):
        lines.append(f"start-up hook (sitecustomize.py): {d['start_up_hook']}")
    lines.append("GPUs (NVML): " + (", ".join(f"{g['name']} {g['capability']}" for g in gpus) if gpus
                                    else f"none ({d['nvml']['error']})"))
    t = d["torch"]
    if t.get("available"):
        dev = f"{t.get('device')} {t.get('capability')}, {t.get('num_sms')} SMs" if t.get("cuda_available") else "no CUDA device"
        if t.get("device_count", 1) > 1:
            dev += f" (current device; {t['device_count']} visible)"
        lines.append(f"torch {t['version']} (CUDA {t['cuda']}): {dev}")
    else:
        lines.append(f"torch: {t.get('error')}")
    lines.append("versions: " + ", ".join(f"{k} {v or '-'}" for k, v in d["versions"].items()))
    if d["env"]:
        lines.append("env: " + ", ".join(f"{k}={v}" for k, v in d["env"].items()))
    for bad in d.get("switches", []):
        name = bad.split(" ", 1)[0]
        then = ("the patch layer installs nothing" if name in switches.GLOBAL
                else "each call that reads it goes back to SGLang's own code")
        lines.append(f"switch error: {bad} ({then})")
    e = d["extension"]
    lines.append(f"extension: loads, built for {', '.join(e['archs'])} ({e['path']})" if e["loads"]
                 else f"extension: does not load: {e['error']}")
    g = e.get("this_gpu")
    if g is not None and g["runs"] is None:
        lines.append(f"extension on this GPU: {g['why']}")
    elif g is not None:
        lines.append("extension on this GPU: runs" if g["runs"] else
                     f"extension on this GPU: NO KERNEL, sparse decode hands its calls back to SGLang and fp4_moe "
                     f"uses its Triton kernels: {g['why']}")
    if d.get("sums"):
        lines.append(f"hc_prenorm sums: {d['sums']}")
    if d.get("triton_choices"):
        lines.append(f"Triton-dependent choices: {d['triton_choices']}")
    lines += d.get("measured", [])
    p = d["patch"]
    lines.append(f"patch layer: {'ACTIVE' if p['active'] else 'inactive'} ({p['why']}); SGLang {p['sglang'] or 'not installed'}")
    for r in p["targets"]:
        reason = r["reason"]
        if not p["active"]:  # say what would happen on an SM12x device
            reason = r["would"]
        lines.append(f"  [{r['status']:>8}] {r['op']:<14} {r['target']}  (SGLang {r['versions']}): {reason}")
    st = d.get("selftest")
    if isinstance(st, dict) and "skipped" in st:
        lines.append(f"self-test: skipped ({st['skipped']})")
    elif st is not None:
        n_dev = len({r.get("device") for r in st})
        several = n_dev > 1  # name the GPU only when there is a choice
        lines.append(f"self-test (on {n_dev} GPUs):" if several else "self-test:")
        for r in st:
            where = f"{r.get('device')} " if several else ""
            lines.append(f"  [{'PASS' if r['ok'] else 'FAIL'}] {where}{r['op']:<14} {r['detail']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m deepseek_v4_kernel doctor", description=__doc__)
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    ap.add_argument("--no-selftest", action="store_true", help="skip the GPU self-test")
    ap.add_argument("--devices", metavar="N[,N...]",
                    help="self-test only these CUDA device indices (default: every visible GPU)")
    args = ap.parse_args(argv)
    devices = None
    if args.devices is not None:
        try:
            indices = [int(i) for i in args.devices.split(",") if i.strip()]
        except ValueError:
            ap.error(f"--devices takes CUDA device indices such as 0,1, got {args.devices!r}")
        if not indices:
            ap.error("--devices: no device index given (e.g. --devices 0,1)")
        try:
            import torch

            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception:
            n = 0
        bad = [f"cuda:{i}" for i in indices if not 0 <= i < n]
        if bad and n:
            ap.error(f"--devices: {', '.join(bad)} not visible ({n} CUDA device(s))")
        devices = [f"cuda:{i}" for i in indices]
    d = collect(run_selftest=not args.no_selftest, devices=devices)
    print(json.dumps(d, indent=2, default=str) if args.json else format_text(d))
    st = d.get("selftest")
    return 1 if d["switches"] or (isinstance(st, list) and not all(r["ok"] for r in st)) else 0
