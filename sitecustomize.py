"""deepseek_v4_kernel start-up hook: runs in every Python process whose PYTHONPATH holds this directory.

(That first line is how copies of this hook recognise each other: keep it.)

Every Python process runs it (pip, shell helpers, compilers' scripts), so it does almost nothing: it reads
DSV4_KERNEL_DISABLE, puts one watcher on ``sys.meta_path`` and imports no module the interpreter has not loaded
already. The patch layer itself (the GPU probe through NVML, the SGLang version, the environment rows, the
target finder: ``deepseek_v4_kernel.patch.install``) is installed when one of the packages the targets live in
is first imported, before that package's own code runs, so SGLang reads the environment rows already set and
every target is still patched the moment its module executes.

It must never break start-up: every failure is swallowed (and said in one line). It also runs the next
``sitecustomize`` on sys.path after this directory (an image may ship one; Python imports only the first it
finds), skipping other copies of this hook (a checkout of this repository in the current directory, reached
through the empty entry of ``PYTHONPATH=/dsv4:`` with an unset variable, is one).
"""

# The top-level packages that the modules (and importers) of patch/targets.py's TARGETS live in; a test keeps
# this equal to the table. Any import under one of them installs the patch layer.
WATCHED_PACKAGES = frozenset(("sglang", "deep_gemm", "flash_mla"))

_MARKER = b"deepseek_v4_kernel start-up hook"   # in the first line of every copy, old and new
_STARTED = "_deepseek_v4_kernel_startup"         # sys.modules key: the first copy that ran in this process


def _is_copy_of_this_hook(path):
    try:
        with open(path, "rb") as f:
            return _MARKER in f.read(256)
    except OSError:
        return False


def _chain_next_sitecustomize():
    """Run the first sitecustomize.py after this file's sys.path entry that is not a copy of this hook."""
    import os
    import sys

    def absolute(entry):
        try:
            return os.path.abspath(entry or os.getcwd())
        except OSError:   # the current directory was removed
            return None

    here = os.path.dirname(os.path.abspath(__file__))
    entries = [absolute(e) for e in sys.path if isinstance(e, str)]
    # only the entries after ours: the ones before were Python's own choice over us (or ran us)
    start = entries.index(here) + 1 if here in entries else 0
    for entry in entries[start:]:
        if entry is None or entry == here:
            continue
        path = os.path.join(entry, "sitecustomize.py")
        if not os.path.isfile(path) or _is_copy_of_this_hook(path):
            continue
        import importlib.util

        spec = importlib.util.spec_from_file_location("_dsv4_chained_sitecustomize", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["_dsv4_chained_sitecustomize"] = module
        spec.loader.exec_module(module)
        return path
    return None


class FirstImportHook:
    """Meta-path watcher: the first import under WATCHED_PACKAGES installs the patch layer; from then on this
    watcher hands each such import to the patch layer's target finder (it stays in its place on sys.meta_path:
    removing an entry while the import system walks the list would skip the next finder)."""

    dsv4_first_import_hook = True   # patch.install() finds it by this: it adds no finder of its own then

    def __init__(self):
        import _thread

        self._lock = _thread.allocate_lock()
        self._installing = None   # thread id while installing: that thread's nested imports pass through
        self._patch = None        # the module deepseek_v4_kernel.patch, once installed
        self._failed = False      # the install failed (said once): this watcher rests

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "deepseek_v4_kernel":
            return self.package_next_to_this_hook()
        if fullname.partition(".")[0] not in WATCHED_PACKAGES:
            return None
        if self._patch is None:
            import _thread

            if self._failed or self._installing == _thread.get_ident():
                return None
            with self._lock:   # another thread importing a watched package waits for the install
                if self._patch is None and (self._failed or not self.install_now()):
                    return None
        finder = getattr(self._patch.installed(), "_finder", None)   # None: inactive, or uninstalled (tests)
        return finder.find_spec(fullname, path, target) if finder is not None else None

    @staticmethod
    def package_next_to_this_hook():
        """The spec of the deepseek_v4_kernel package beside this file (None if there is none): the package this hook
        belongs to wins over any other copy on the path, such as a source checkout in the current directory, which
        `python -m` puts first and which has no compiled library in it."""
        import os

        pkg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deepseek_v4_kernel")
        init = os.path.join(pkg, "__init__.py")
        if not os.path.isfile(init):
            return None
        import importlib.util

        return importlib.util.spec_from_file_location("deepseek_v4_kernel", init, submodule_search_locations=[pkg])

    def install_now(self):
        """Install the patch layer (once); False if it failed (said in one line; this watcher then rests)."""
        import _thread
        import sys

        self._installing = _thread.get_ident()
        try:
            import deepseek_v4_kernel.patch as patch

            patch.install()
            self._patch = patch
            return True
        except BaseException as e:  # noqa: BLE001 - an import must survive anything
            self._failed = True
            print(f"[deepseek_v4_kernel] not installed: {type(e).__name__}: {e}", file=sys.stderr)
            return False
        finally:
            self._installing = None


def _start():
    import os
    import sys

    me = sys.modules.get(__name__)
    if me is None:   # run by something other than the import system (a test, runpy): nothing to share
        return
    if sys.modules.setdefault(_STARTED, me) is not me:   # another copy of this hook already ran here
        return
    try:
        disable = os.environ.get("DSV4_KERNEL_DISABLE", "").strip().lower()
        if disable not in ("", "1", "true", "yes", "on", "0", "false", "no", "off"):   # (switches.py's words)
            print("[deepseek_v4_kernel] not installed: DSV4_KERNEL_DISABLE must be one of 1/true/yes/on (on) or "
                  f"0/false/no/off (off), got {os.environ['DSV4_KERNEL_DISABLE']!r}", file=sys.stderr)
        elif disable not in ("1", "true", "yes", "on"):
            hook = FirstImportHook()
            sys.meta_path.insert(0, hook)
            # a .pth file (or an earlier hook) may have imported one already: install now
            if any(name in sys.modules for name in WATCHED_PACKAGES):
                hook.install_now()
    except BaseException as e:  # noqa: BLE001 - start-up must survive anything
        print(f"[deepseek_v4_kernel] not installed: {type(e).__name__}: {e}", file=sys.stderr)
    try:
        _chain_next_sitecustomize()
    except BaseException as e:  # noqa: BLE001
        print(f"[deepseek_v4_kernel] the next sitecustomize on sys.path failed: {type(e).__name__}: {e}",
              file=sys.stderr)


_start()
