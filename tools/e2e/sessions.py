"""Session names of the end-to-end harness: ``<setup>-<graphs|eager>[-modifiers]`` (pure)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import setups as st


class SessionSpec(NamedTuple):
    key: str           # setup a / b / c
    graphs: bool
    mtp: bool
    soak: bool
    measured: bool     # (b) with DSV4_KERNEL_PREFER=measured and the bench file of prepare (MEASURED_DIR)
    native: bool = False    # (a) / (b) with Triton and TileLang in the test GPU's own instruction class
    default: bool = False   # (b) with default settings (setups.default_variant), a fresh DSV4_KERNEL_CACHE_DIR
    restart: bool = False   # (-default-restart) the same, started again on the first start's cache directory

    @property
    def timed(self) -> bool:
        """Whether the session takes its profile key's throughput table and profile (one of each per key)."""
        return self.graphs and not (self.mtp or self.measured or self.soak or self.default)

    @property
    def profile_key(self) -> str:
        """The key of the session's profile in e2e.json: the setup, '-native' for the native instruction class."""
        return self.key + ("-native" if self.native else "")

    @property
    def base(self) -> Optional[str]:
        """The session a -restart session must follow (its first start)."""
        return f"{self.key}-{'graphs' if self.graphs else 'eager'}-default" if self.restart else None


MODIFIERS = ("mtp", "soak", "measured", "native", "default", "restart")


def parse_session(name: str) -> SessionSpec:
    parts = name.split("-")
    mods = parts[2:]
    if len(parts) < 2 or parts[0] not in st.SETUP_KEYS or parts[1] not in ("graphs", "eager") or \
            any(p not in MODIFIERS for p in mods) or len(set(mods)) != len(mods):
        raise ValueError(f"session {name!r}: expected <a|b|c>-<graphs|eager>[-mtp][-soak][-measured][-native]"
                         f"[-default[-restart]]")
    for mod in ("measured", "default"):
        if mod in mods and parts[0] != "b":
            raise ValueError(f"session {name!r}: -{mod} is a setting of our patch, so of setup b only")
    if "native" in mods and parts[0] == "c":
        raise ValueError(f"session {name!r}: -native is for the SM120-view setups a and b (c is native already)")
    if "restart" in mods and mods[-2:] != ["default", "restart"]:
        raise ValueError(f"session {name!r}: -restart follows -default (the second start of that session)")
    if "default" in mods and ({"measured", "mtp", "soak", "native"} & set(mods)):
        raise ValueError(f"session {name!r}: -default takes no other modifier")
    return SessionSpec(parts[0], parts[1] == "graphs", "mtp" in mods, "soak" in mods, "measured" in mods,
                       "native" in mods, "default" in mods, "restart" in mods)
