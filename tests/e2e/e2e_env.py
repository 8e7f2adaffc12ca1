"""Paths of the end-to-end harness's CPU-side tests: its modules live in tools/e2e/ (plain scripts, no package), and
the repository's tests/sglang_env.py runs Python in a child process over a real SGLang wheel's sources."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SGLANG_VERSION = "0.5.17"  # the release the harness runs on the GPU machine (its torch 2.11.0 pin)
for _path in (os.path.join(ROOT, "tools", "e2e"), os.path.join(ROOT, "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)
