"""Running a test case in a private mount namespace, where it may mount and unmount as it likes (root only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NEEDS_MOUNTS = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("mount") is None,
    reason="mounts need root and unshare (a private mount namespace), which this machine lacks")


def in_namespace(tmp_path: Path, body: str, prelude: str = "") -> str:
    """Run ``body`` (Python) in a fresh process inside ``unshare -m``, with ``B`` the test's ``tmp_path``,
    ``mount(*args)`` and ``prelude`` defined first; return its stdout and the tail of its stderr. The mounts it makes
    end with it, whatever it does."""
    script = tmp_path / "case.py"
    script.write_text(f"import os, subprocess, sys, pathlib\nsys.path[:0] = {[p for p in sys.path if p]!r}\n"
                      f"B = pathlib.Path({str(tmp_path)!r})\n"
                      "def mount(*args):\n    subprocess.run(['mount', *args], check=True)\n"
                      f"{prelude}\n{body}")
    env = {**os.environ, "MECHKIT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, str(script)],
                          capture_output=True, text=True, env=env, timeout=300)
    return done.stdout + done.stderr[-3000:]
