"""Red-team pass 35 (a): what it found that could be fixed at once.

F1: a user's file where mechkit's subfolder was, inside a returned folder, was replaced or deleted by a
``--force`` rerun. F4: a ``config.json`` nested 100 000 deep was a RecursionError. F6: a deleted working
directory with a tiny model was a FileNotFoundError. F8/F3a: ``write_report`` split ``artifacts="abc"`` into
letters and failed on ``artifacts=5`` with a TypeError.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import put_files, returning_files


@pytest.mark.parametrize("second", [{"sub/x.txt": "2", "a.txt": "2"}, {"a.txt": "2"}])
def test_a_users_file_where_mechkits_folder_was_is_refused_not_deleted(tmp_path, second):
    out = tmp_path / "out"
    mk.run(returning_files({"m": put_files(tmp_path / "f", {"sub/x.txt": "1", "a.txt": "1"})}, "rt35a"), out=out)
    shutil.rmtree(out / "m" / "sub")
    (out / "m" / "sub").write_text("USER PRECIOUS")
    with pytest.raises(MechkitError, match="where it wrote another of the set"):
        mk.run(returning_files({"m": put_files(tmp_path / "g", second)}, "rt35a"), out=out, force=True)
    assert (out / "m" / "sub").read_text() == "USER PRECIOUS"


def test_a_config_nested_too_deeply_is_one_line(tmp_path):
    from mechkit.model.sources.tiny import byte_tokenizer, tiny_model

    model, _ = tiny_model("llama")
    model.save_pretrained(tmp_path / "m")
    byte_tokenizer().save_pretrained(tmp_path / "m")
    text = json.dumps(json.loads((tmp_path / "m" / "config.json").read_text()))
    (tmp_path / "m" / "config.json").write_text(text[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(MechkitError, match="nested too deeply"):
        mk.load_model(str(tmp_path / "m"))


def test_a_deleted_working_directory_is_one_line_with_a_tiny_model(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    code = ("import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
            "from mechkit.cli.main import main; sys.argv = ['mechkit', 'inspect', '--model', 'tiny:gpt2', "
            "'--out', sys.argv[2]]; main()")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code, str(gone), str(tmp_path / "o")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "working directory" in done.stderr


@pytest.mark.parametrize("artifacts", ["abc", 5])
def test_write_report_refuses_artifacts_that_are_no_list(tmp_path, artifacts):
    from mechkit.report import build_report, write_report

    rep = build_report(plugin="p", plugin_version="0.1", model={"spec": "tiny:llama"}, params={}, seed=0,
                       results={"s": 1}, artifacts=[], timings={})
    with pytest.raises(MechkitError, match="must be a list of file names"):
        write_report(tmp_path / "o", {**rep, "artifacts": artifacts})
    assert not (tmp_path / "o").exists()
