"""Where mechkit keeps what it builds once and reuses: converted models, the toy model, run steps."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$MECHKIT_CACHE``, else ``$XDG_CACHE_HOME/mechkit``, else ``~/.cache/mechkit``."""
    if os.environ.get("MECHKIT_CACHE"):
        return Path(os.environ["MECHKIT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mechkit"
