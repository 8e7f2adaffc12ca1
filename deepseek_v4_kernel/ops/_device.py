"""Device facts the ops size their grids with, read once per device (no query on the hot path, so
calls stay CUDA-graph safe)."""
import functools

import torch


@functools.lru_cache(maxsize=None)
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Number of SMs of a CUDA device (its index, or the current device when it has none)."""
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())
