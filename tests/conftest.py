"""Shared test setup.

* Without a CUDA device, Triton kernels run in interpreter mode (TRITON_INTERPRET=1)
  so CI (no GPU, 2 cores) still exercises them at small shapes. The variable must be
  set before triton is first imported, hence here, at collection start.
* ``gpu`` marks tests that need a CUDA device; they skip with the reason.
* DSV4_KERNEL_STRICT=1: an op that cannot handle a case raises instead of handing back.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("DSV4_KERNEL_STRICT", "1")

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except Exception:  # torch missing: only the patch-layer tests can run
    torch = None
    HAS_CUDA = False

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "uses_first_gpu: a multi-GPU test that allocates on cuda:0 itself")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="no CUDA device on this machine (GPU test)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def built_library():
    """Path of the compiled _C.so the tests can load on any machine (no GPU needed for its C ABI checks), or None:
    DSV4_KERNEL_LIB, else the one beside the imported package (PYTHONPATH=build/dsv4), else where the README's
    scripts/build.sh puts it (build/dsv4/deepseek_v4_kernel/_C.so)."""
    import deepseek_v4_kernel

    for path in (os.environ.get("DSV4_KERNEL_LIB"),
                 os.path.join(os.path.dirname(os.path.abspath(deepseek_v4_kernel.__file__)), "_C.so"),
                 os.path.join(ROOT, "build", "dsv4", "deepseek_v4_kernel", "_C.so")):
        if path and os.path.exists(path):
            return path
    return None


@pytest.fixture
def device():
    """'cuda' where there is a GPU, else 'cpu' (Triton interpreter)."""
    return "cuda" if HAS_CUDA else "cpu"
