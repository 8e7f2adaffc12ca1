"""deepseek_v4_kernel start-up hook: runs in every Python process whose PYTHONPATH holds this directory.

It must never break start-up: every failure is swallowed (and said in one line). It also
runs the ``sitecustomize`` that was on the path before ours (the image may ship one), since
Python only imports the first one it finds.
"""


def _chain_previous_sitecustomize():
    """Find and run the next sitecustomize.py on sys.path after this file's directory."""
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        try:
            path = os.path.join(os.path.abspath(entry or os.getcwd()), "sitecustomize.py")
        except Exception:
            continue
        if os.path.dirname(path) == here or not os.path.isfile(path):
            continue
        spec = importlib.util.spec_from_file_location("_dsv4_chained_sitecustomize", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["_dsv4_chained_sitecustomize"] = module
        spec.loader.exec_module(module)
        return path
    return None


def _install():
    import os

    if os.environ.get("DSV4_KERNEL_DISABLE", "").strip().lower() in ("1", "true", "yes", "on"):
        return
    from deepseek_v4_kernel.patch import install

    install()


try:
    _install()
except BaseException as _e:  # noqa: BLE001 - start-up must survive anything
    import sys as _sys

    print(f"[deepseek_v4_kernel] not installed: {type(_e).__name__}: {_e}", file=_sys.stderr)

try:
    _chain_previous_sitecustomize()
except BaseException as _e:  # noqa: BLE001
    import sys as _sys

    print(f"[deepseek_v4_kernel] the previous sitecustomize failed: {type(_e).__name__}: {_e}", file=_sys.stderr)
