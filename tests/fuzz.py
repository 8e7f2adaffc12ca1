"""Shared pieces of the randomised GPU checks (each op's test_gpu_fuzz*).

* SEEDS: DSV4_FUZZ_CASES (default 8) seeds from DSV4_FUZZ_SEED (default 0); one seed draws one whole call, so a
  failure reproduces alone with DSV4_FUZZ_SEED=<seed> DSV4_FUZZ_CASES=1.
* SM_COUNTS / patch_sm_count: launches sized for the SM counts of the cards we ship for.
* named(desc): an assertion failing inside says which call (desc) it was.
* replay_on_poisoned: the decode-path ops must give, replayed from a CUDA graph on NaN-poisoned outputs, the
  same bits as an eager call (no host sync, no per-call allocation or host-side state baked wrongly into the
  capture)."""
import contextlib
import os

import torch

SEEDS = range(int(os.environ.get("DSV4_FUZZ_SEED", "0")),
              int(os.environ.get("DSV4_FUZZ_SEED", "0")) + int(os.environ.get("DSV4_FUZZ_CASES", "8")))


# SM counts a call's grid may be sized for: this GPU's (None), an RTX 5090's, an RTX PRO 6000's, a small one. The
# ops read the count from one function each, so patching it gives the launch those cards would get (the
# kernels take any grid the Python side decides).
SM_COUNTS = (None, 170, 188, 24)


def patch_sm_count(monkeypatch, module, name: str, sms):
    if sms:
        monkeypatch.setattr(module, name, lambda dev, n=sms: n)


@contextlib.contextmanager
def named(desc: str):
    try:
        yield
    except AssertionError as e:
        raise AssertionError(f"{desc}\n{e}") from None


def replay_on_poisoned(call, poison, warm_up=True):
    """Warm ``call()`` up once on a side stream (as SGLang's graph runner does, so per-stream buffers exist;
    ``warm_up=False``: the captured call is the stream's first), capture one call in a CUDA graph there, fill
    the tensors ``poison(result)`` returns with NaN (integers with -1), replay, synchronize and return the
    captured call's result."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    if warm_up:
        with torch.cuda.stream(s):
            call()
        torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        res = call()
    for t in poison(res):
        t.fill_(float("nan") if t.is_floating_point() else -1)
    g.replay()
    torch.cuda.synchronize()
    return res
