"""Shared pieces of the ahead-of-time Triton compile checks (tools/aot_*.py; no GPU needed): the
divisibility hints the JIT would specialise, registers / spills read from the cubin, and the
"AOT"-prefixed JSON record per compiled case that the tests parse."""
import json
import os
import re
import subprocess
import tempfile

import triton


def divisibility_attrs(fn, names):
    """tt.divisibility 16 on these arguments of `fn`: what the JIT specialises at 16-byte aligned
    pointers and strides (without it Triton neither vectorises nor pipelines as it does at run time)."""
    return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}


def resource_usage(cubin: bytes) -> dict:
    """Registers and stack / local (spill) bytes from cuobjdump (shipped with Triton's NVIDIA backend):
    a compiled kernel reports them only once loaded on a GPU."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        txt = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?LOCAL:(\d+)", txt, re.S)
    if not m:
        raise RuntimeError("cuobjdump --dump-resource-usage: no REG/STACK/LOCAL in\n" + txt)
    return dict(regs=int(m.group(1)), stack=int(m.group(2)), local=int(m.group(3)))


def emit(cases, json_path=None):
    """`cases`: (record, compile) pairs; compile() returns the results merged into the record (an
    exception is recorded as "error"). Prints each record as one "AOT"-prefixed JSON line; writes them
    all to `json_path` when given."""
    res = []
    for rec, compile_case in cases:
        try:
            rec.update(compile_case())
        except Exception as e:  # noqa: BLE001
            rec["error"] = (type(e).__name__ + ": " + str(e))[-600:]
        res.append(rec)
        print("AOT" + json.dumps(rec), flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=1)
    return res
