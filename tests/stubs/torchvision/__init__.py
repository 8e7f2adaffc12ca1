"""Test stub: SGLang's utilities import torchvision.io.decode_jpeg; PyPI's torchvision does not
load beside the CPU torch build CI uses, and nothing the patch layer touches needs it."""
