"""Run a bench script with the previous rule for the warp-specialised kernel (64 / 32 / 16 heads from 4 tiles per
block) when DSV4_AB_OLD=1: A/B of run 53's WS_MIN_TILES change in one library."""
import os, runpy, sys
sys.path.insert(0, os.getcwd())
import deepseek_v4_kernel.ops.sparse_decode as sd
if os.environ.get("DSV4_AB_OLD") == "1":
    sd.WS_MIN_TILES = {64: 4, 32: 4, 16: 4}
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
