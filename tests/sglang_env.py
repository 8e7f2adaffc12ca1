"""Run Python in a child process the way a user's SGLang process starts: our build dir on
PYTHONPATH (so sitecustomize.py runs first), plus a real SGLang wheel's sources.

The wheels are unpacked by scripts/fetch_sglang_wheels.sh into .sglang/ (CI does this).
Controlled imports, for modules that cannot load on a CPU machine:
* ``tests/stubs/torchvision``: SGLang >= 0.5.13 imports ``torchvision.io.decode_jpeg`` in
  its utilities; PyPI's torchvision does not load beside the CPU torch, and nothing we
  patch uses it. Put on the path only where torchvision does not import.
* FlashMLA (called by SGLang 0.5.12): the wheel's real Python files, with its CUDA loader
  ``flash_mla._loader`` replaced by a stub whose ops raise (the .so files need a GPU).
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELS = os.environ.get("DSV4_SGLANG_WHEELS_DIR", os.path.join(ROOT, ".sglang"))
STUBS = os.path.join(ROOT, "tests", "stubs")


def sglang_dir(version: str) -> str:
    d = os.path.join(WHEELS, f"sglang-{version}")
    if not os.path.isdir(os.path.join(d, "sglang")):
        pytest.skip(f"SGLang {version} sources not unpacked in {WHEELS}: run scripts/fetch_sglang_wheels.sh")
    return d


def flash_mla_dir() -> str:
    d = os.path.join(WHEELS, "flash_mla")
    if not os.path.isdir(os.path.join(d, "flash_mla")):
        pytest.skip(f"FlashMLA sources not unpacked in {WHEELS}: run scripts/fetch_sglang_wheels.sh")
    return d


def _torchvision_loads() -> bool:
    r = subprocess.run([sys.executable, "-c", "import torchvision.io"], capture_output=True)
    return r.returncode == 0


_TV = None

# Installed in the child before anything imports flash_mla (see module docstring).
FLASH_MLA_LOADER_STUB = textwrap.dedent(
    """
    import sys, types
    _stub = types.ModuleType("flash_mla._loader")
    def get_ops(use_legacy=False):
        raise RuntimeError("flash_mla CUDA ops are not loadable on this machine (test stub)")
    _stub.get_ops = get_ops
    _stub.has_legacy = lambda: False
    sys.modules["flash_mla._loader"] = _stub
    """
)


def run_child(code: str, path=(), env=None, timeout=240, with_root=True) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter; PYTHONPATH = [repo root] + path."""
    global _TV
    if _TV is None:
        _TV = _torchvision_loads()
    entries = ([ROOT] if with_root else []) + list(path)
    if not _TV:
        entries.append(STUBS)
    e = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_")}
    e["PYTHONPATH"] = os.pathsep.join(entries)
    e["PYTHONUNBUFFERED"] = "1"
    if env:
        e.update(env)
    # cwd outside the repo: `python -c` puts the cwd on sys.path, which would hide what PYTHONPATH holds.
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=e, timeout=timeout, cwd=tempfile.gettempdir())


REPORT_JSON = """
import json
from deepseek_v4_kernel.patch import report
print("REPORT=" + json.dumps(report()))
"""


def parse_report(stdout: str):
    for line in stdout.splitlines():
        if line.startswith("REPORT="):
            return json.loads(line[len("REPORT="):])
    raise AssertionError(f"no report in output:\n{stdout}")
