"""The one parser of our environment switches (stdlib only: the start-up path may import it).

A boolean switch reads 1 / true / yes / on as true and 0 / false / no / off as false, in any case, with surrounding
blanks ignored; unset or empty means its default. Anything else is an error that names the variable, the accepted
values and the value found; a choice switch (``choice``) likewise names one of a fixed list of values:
``InvalidSwitch``, an ``UnsupportedCase``, so a call that meets it inside an op goes back
to SGLang's own code (logged once; raised with DSV4_KERNEL_STRICT=1) instead of guessing what the user meant.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from .errors import UnsupportedCase

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class InvalidSwitch(UnsupportedCase):
    """An environment switch holds a value we do not accept."""


def env_bool(name: str, default: bool) -> bool:
    """The boolean switch ``name`` (see the module docstring)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    v = raw.strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise InvalidSwitch(f"{name} must be one of {'/'.join(TRUE)} (on) or {'/'.join(FALSE)} (off), got {raw!r}")


def choice(name: str, accepted: Sequence[str], default: Optional[str] = None) -> Optional[str]:
    """The choice switch ``name``: one of ``accepted`` (lower-case names, matched in any case, surrounding blanks
    ignored); unset or empty gives ``default``. Any other value raises InvalidSwitch naming the variable, the
    accepted values and the value found (a typo such as ``measure`` for ``measured`` is never silently ignored)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    v = raw.strip().lower()
    if v not in accepted:
        unset = f" (unset: {default})" if default is not None else ""
        raise InvalidSwitch(f"{name} must be one of {', '.join(accepted)}, got {raw!r}{unset}")
    return v


def env_choice(name: str, choices: Sequence[str], default: Optional[str] = None) -> Optional[str]:
    """Same as ``choice`` (the name the ops used first)."""
    return choice(name, choices, default)
