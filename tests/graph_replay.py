"""CUDA-graph replay in tests: the decode-path ops must give, replayed from a graph on NaN-poisoned outputs,
the same bits as an eager call (no host sync, no per-call allocation or host-side state baked wrongly into
the capture)."""
import torch


def replay_on_poisoned(call, poison):
    """Warm ``call()`` up once on a side stream (as SGLang's graph runner does, so per-stream buffers exist),
    capture one call in a CUDA graph there, fill the tensors ``poison(result)`` returns with NaN (integers
    with -1), replay, synchronize and return the captured call's result."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
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
