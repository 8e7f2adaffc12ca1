"""Reading the C parameter blocks (csrc/*/params.h) in tests: their fields, to compare with the ctypes mirrors
in deepseek_v4_kernel/_ext.py (the loader compares only the struct sizes)."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def header(op: str) -> str:
    """Text of csrc/<op>/params.h."""
    return open(os.path.join(ROOT, "csrc", op, "params.h")).read()


def struct_fields(src: str, name: str):
    """Field names of `typedef struct <name> { ... } <name>;` in header text `src`, in order."""
    body = src[src.index(f"typedef struct {name}"):src.index(f"}} {name};")]
    return re.findall(r"^\s+(?:const )?\w+\*? ?\*?(\w+);", body, re.M)
