"""A ``--force`` write killed half-way (``os._exit`` in a child process): the states a roll-back meets.

The write puts ``{model/, a.txt}`` over an earlier set of the same names (``model/config.json`` ``{}``, ``a.txt``
``1``), as ``taskvec apply`` would, and dies at a chosen move:

- ``"after-model"``: just after its new ``model/`` was moved in (its ``a.txt``, ``2``, is in already);
- ``"first-move-in"``: at its first move in, the whole old set aside in the temporary folder's ``.previous``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mechkit.io.journal import journal_path

SCRIPT = """
import os, sys
from pathlib import Path
import mechkit.io.replace as R
out, when = Path(sys.argv[1]), sys.argv[2]
with R.replacing_dir(out, writer="taskvec apply", force=True) as tmp:
    (tmp / "model").mkdir(); (tmp / "model" / "config.json").write_text("{}"); (tmp / "a.txt").write_text("1")
real = os.replace
def replace(src, dst):
    moving_in = ".tmp-" in Path(src).parent.name and Path(dst).parent == out
    if moving_in and when == "first-move-in":
        os._exit(9)
    real(src, dst)
    if moving_in and when == "after-model" and Path(src).name == "model":
        os._exit(9)
R.os.replace = replace
with R.replacing_dir(out, writer="taskvec apply", force=True) as tmp:
    (tmp / "model").mkdir(); (tmp / "model" / "config.json").write_text('{"new": 1}'); (tmp / "a.txt").write_text("2")
"""


def killed_write(tmp_path: Path, when: str, old_journal: bool = False) -> Path:
    """The ``--out`` (``tmp_path/out``) of a write killed ``when``; ``old_journal``: its journal as a mechkit
    before the record of trees and inodes wrote it."""
    out = tmp_path / "out"
    script = tmp_path / "killed.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(out), when], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert done.returncode == 9 and journal_path(out).exists(), done.stderr[-2000:]
    if old_journal:
        record = json.loads(journal_path(out).read_text())
        record.pop("trees", None)
        record.pop("ids", None)
        journal_path(out).write_text(json.dumps(record))
    return out
