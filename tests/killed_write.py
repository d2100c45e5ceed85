"""A ``--force`` write killed half-way (``os._exit`` in a child process): the states a roll-back meets.

The write puts ``{model/, a.txt}`` over an earlier set of the same names (``model/config.json`` ``{}``, ``a.txt``
``1``), as ``taskvec apply`` would, and dies at a chosen move:

- ``"after-model"``: just after its new ``model/`` was moved in (its ``a.txt``, ``2``, is in already);
- ``"after-NAME"``: just after the entry ``NAME`` was moved in;
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
import json, os, sys
from pathlib import Path
import mechkit.io.replace as R
out, when, spec = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
def fill(tmp, files):
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
with R.replacing_dir(out, writer=spec["writer"], force=True) as tmp:
    fill(tmp, spec["old"])
real = os.replace
def replace(src, dst):
    moving_in = ".tmp-" in Path(src).parent.name and Path(dst).parent == out
    if moving_in and when == "first-move-in":
        os._exit(9)
    real(src, dst)
    if moving_in and when == "after-" + Path(src).name:
        os._exit(9)
R.os.replace = replace
with R.replacing_dir(out, writer=spec["writer"], force=True) as tmp:
    fill(tmp, spec["new"])
"""


OLD = {"model/config.json": "{}", "a.txt": "1"}
NEW = {"model/config.json": '{"new": 1}', "a.txt": "2"}


def killed_write(tmp_path: Path, when: str, old_journal: bool = False, old: dict[str, str] = OLD,
                 new: dict[str, str] = NEW, writer: str = "taskvec apply") -> Path:
    """The ``--out`` (``tmp_path/out``) of a write of ``new`` over ``old`` (file name: text) killed ``when``
    (``"after-NAME"``: just after the entry ``NAME`` was moved in); ``old_journal``: its journal as a mechkit
    before the record of its entries wrote it."""
    out = tmp_path / "out"
    script = tmp_path / "killed.py"
    script.write_text(SCRIPT)
    spec = json.dumps({"old": old, "new": new, "writer": writer})
    done = subprocess.run([sys.executable, str(script), str(out), when, spec], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert done.returncode == 9 and journal_path(out).exists(), done.stderr[-2000:]
    if old_journal:
        record = json.loads(journal_path(out).read_text())
        record.pop("entries", None)
        journal_path(out).write_text(json.dumps(record))
    return out
