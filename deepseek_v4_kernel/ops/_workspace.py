"""Persistent scratch buffers of the ops (split-K / split-KV partials), one set per (device, stream).

Why persistent: a CUDA graph records the address of every buffer its kernels touch, so scratch memory
must outlive the capture, and a per-call allocation would cost host time on every eager call. Why per
stream: two streams may run the same op at once (SGLang's two-batch overlap); calls on one stream are
ordered, and every kernel that writes a buffer waits (griddepcontrol.wait, or a plain launch) for the
previous kernel of its stream first, so consecutive calls can share one buffer.
"""
from typing import Optional

import torch


def stream_key(device: torch.device):
    """(device index, current stream handle); ("cpu", 0) off CUDA."""
    if device.type != "cuda":
        return ("cpu", 0)
    return (device.index, torch.cuda.current_stream(device).cuda_stream)


def scratch(pool: dict, device: torch.device, numel: int, dtype=torch.float32,
            min_numel: int = 1 << 16, max_numel: Optional[int] = None) -> torch.Tensor:
    """A flat ``numel``-element view of ``pool``'s buffer for (device, current stream, dtype).

    The buffer grows in powers of two (from ``min_numel``) outside graph capture, so it always holds the
    largest request seen so far rounded up (< 2x it). Outgrown buffers stay alive in ``pool`` because
    graphs captured earlier still point at them (together < the newest one). A request above
    ``max_numel`` gets its own allocation (torch.empty, freed with the call's tensors) instead, so the
    memory a pool holds stays under 2 x max_numel rounded up. While a graph is being captured and no
    buffer is big enough (no eager call of that size came first on this stream), the call gets its own
    allocation from the graph's memory pool, which is what a plain torch.empty would do."""
    if max_numel is not None and numel > max_numel:
        return torch.empty(numel, dtype=dtype, device=device)
    key = stream_key(device) + (dtype,)
    bufs = pool.setdefault(key, [])
    if bufs and bufs[-1].numel() >= numel:
        return bufs[-1][:numel]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.empty(numel, dtype=dtype, device=device)
    size = max(min_numel, 1 << max(0, numel - 1).bit_length())
    bufs.append(torch.empty(size, dtype=dtype, device=device))
    return bufs[-1][:numel]


def zeroed(pool: dict, device: torch.device, numel: int, dtype) -> Optional[torch.Tensor]:
    """``pool``'s zero-initialised buffer for (device, current stream), made once: buffers whose kernels leave them
    as they found them (counters reset by their last user, epochs / tickets kept consistent), so no launch or graph
    replay needs a memset. None while a graph is being captured and no buffer exists yet: it cannot be zeroed
    eagerly then, and the caller takes a path without it."""
    key = stream_key(device)
    buf = pool.get(key)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = pool[key] = torch.zeros(numel, dtype=dtype, device=device)
    return buf
