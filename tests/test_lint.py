"""The code is ruff clean (the project's rules in pyproject.toml), checked with the suite so CI holds it.

A lint error committed between two ``make lint`` runs (a nested ``with`` in a test, an unchecked ``zip``)
fails here, on every clone, instead of waiting for someone to run the linter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_code_is_ruff_clean():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
