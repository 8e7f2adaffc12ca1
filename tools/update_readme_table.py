"""Rewrite the README's target table from deepseek_v4_kernel/patch/targets.py (between the markers)."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from deepseek_v4_kernel.patch.targets import markdown_table  # noqa: E402

path = os.path.join(ROOT, "README.md")
text = open(path).read()
new = re.sub(r"(<!-- targets:begin -->\n).*?(\n<!-- targets:end -->)",
             lambda m: m.group(1) + markdown_table() + m.group(2), text, flags=re.S)
open(path, "w").write(new)
print("README target table updated" if new != text else "README target table already current")
