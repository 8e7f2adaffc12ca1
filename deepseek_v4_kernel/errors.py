"""Exceptions shared by every op and by the patch layer."""


class UnsupportedCase(ValueError):
    """An input our kernel does not cover (or a malformed input).

    The message names the argument and what was expected, e.g.
    ``sparse_decode: q must be bf16 [b, s_q, h_q, 512], got float16 [2, 1, 64, 512]``.
    The patch layer catches it and hands the call back to the original
    implementation (logged once per distinct message); with
    ``DSV4_KERNEL_STRICT=1`` it propagates instead.
    """


class KeepOriginal(UnsupportedCase):
    """Not a gap in our kernel: SGLang's own kernel was measured faster for this call's size class, so the patch
    layer runs the original for it (counted and logged once at INFO as "kept", never as a hand-back, and not
    raised under ``DSV4_KERNEL_STRICT=1``). The message names the op, the size class and the measurement."""


class ExtensionUnavailable(RuntimeError):
    """The compiled extension (deepseek_v4_kernel/_C.so) is missing or does not load."""
