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
    # the wheel's RECORD says the unpack was whole (a few files copied there, e.g. for a benchmark
    # on the GPU machine, are not a wheel the patch tests can run against)
    if not os.path.isfile(os.path.join(d, f"sglang-{version}.dist-info", "RECORD")):
        pytest.skip(f"SGLang {version} in {d} is not a whole unpacked wheel (no dist-info/RECORD): "
                    "run scripts/fetch_sglang_wheels.sh")
    return d


def stand_in_deep_gemm(directory) -> str:
    """Write a module ``deep_gemm`` into ``directory`` with DeepGEMM's prenorm entry point, failing the way the
    real one does on SM120 (no DeepGEMM wheel installs on a CPU machine), and return ``directory`` for a path."""
    with open(os.path.join(str(directory), "deep_gemm.py"), "w") as f:
        f.write("def tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None):\n"
                "    raise RuntimeError('Unsupported architecture')\n")
    return str(directory)


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


# Third-party packages a CPU test machine lacks and SGLang's DeepSeek-V4 modules import at import time.
STAND_IN = ("transformers", "tilelang", "tvm_ffi", "deep_gemm", "flashinfer", "sgl_kernel")

# Controlled imports for modules whose import chain reaches packages a CPU machine does not have
# (STAND_IN). A finder placed LAST on sys.meta_path serves a permissive stand-in for those names
# when no real finder finds them, so the real SGLang source of the target module executes.
STUB_MISSING_MODULES = textwrap.dedent(
    """
    import importlib.abc, importlib.machinery, sys, types

    class _StubMeta(type):
        def __getattr__(cls, name):
            if name.startswith("__") and name.endswith("__"):
                raise AttributeError(name)
            return _stub_class(f"{cls.__name__}.{name}")
        def __call__(cls, *args, **kwargs):
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return args[0]  # used as a decorator
            return _stub_class(cls.__name__ + "()")
        def __getitem__(cls, item):
            return cls
        def __iter__(cls):
            return iter(())
        def __or__(cls, other):
            return cls
        __ror__ = __or__
        def __bool__(cls):
            return False

    def _stub_class(name):
        return _StubMeta(name, (), {})

    class _StubModule(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__") and name.endswith("__"):
                raise AttributeError(name)
            return _stub_class(f"{self.__name__}.{name}")
        def __call__(self, *args, **kwargs):  # a stood-in package used as a decorator (tilelang.jit)
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return args[0]
            return _stub_class(self.__name__ + "()")

    class _StubLoader(importlib.abc.Loader):
        def create_module(self, spec):
            m = _StubModule(spec.name)
            m.__path__ = []
            m.__dsv4_stub__ = True
            return m
        def exec_module(self, module):
            pass

    class _StubMissing(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname.split(".")[0] not in STAND_IN:
                return None
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)

    STAND_IN = set(%r)
    sys.meta_path.append(_StubMissing())
    """
) % (STAND_IN,)


def real_module_prelude(target: str, *also_real: str) -> str:
    """Code that makes ``import <target>`` execute the target's real source file while every other
    ``sglang.*`` module it imports is a stand-in (and its parent packages are bare packages over the
    real directories, their __init__ not run), except the modules in ``also_real``, which load their real
    files the same way. For SGLang modules whose import chain cannot load on a CPU machine (model configs
    needing transformers, tilelang kernels, ...). Combine with STUB_MISSING_MODULES for third-party names."""
    return STUB_MISSING_MODULES + textwrap.dedent(
        f"""
        import os
        _REAL = {{{target!r}, *{list(also_real)!r}}}
        _PARENTS = set()
        for _p in _REAL:
            while "." in _p:
                _p = _p.rsplit(".", 1)[0]
                _PARENTS.add(_p)
        _BASE = [p for p in sys.path if os.path.isdir(os.path.join(p, "sglang"))][0]

        class _ControlledSGLang(importlib.abc.MetaPathFinder):
            def find_spec(self, fullname, path, target=None):
                if fullname.split(".")[0] != "sglang" or fullname in _REAL:
                    return None  # the real modules: the normal finders load their files
                if fullname in _PARENTS:
                    spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
                    spec.submodule_search_locations = [os.path.join(_BASE, *fullname.split("."))]
                    return spec
                return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)

        sys.meta_path.insert(0, _ControlledSGLang())
        """
    )
