"""Bad input a hostile user hands in: one line naming the problem, exit 2, nothing written."""

from __future__ import annotations

import pytest
import torch

from mechkit.errors import MechkitError
from mechkit.model.tiny import byte_tokenizer, tiny_model


def _model_dir(path, truncate: bool = False):
    model, _ = tiny_model("llama")
    model.save_pretrained(path, safe_serialization=True)
    byte_tokenizer().save_pretrained(path)
    if truncate:
        weights = path / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    return path


def test_truncated_finetuned_weights_are_one_line_for_taskvec_extract(tmp_path, capsys):
    from mechkit.cli.main import main

    ft = _model_dir(tmp_path / "ft", truncate=True)
    capsys.readouterr()  # transformers' own save progress
    with pytest.raises(SystemExit) as exit_info:
        main(["taskvec", "extract", "--base", "tiny:llama", "--finetuned", str(ft), "--out", str(tmp_path / "v.st")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert "cannot read weights" in err[0] and "truncated" in err[0]
    assert not (tmp_path / "v.st").exists()


@pytest.mark.parametrize("expression", ["+".join(["a"] * 5000), "-" * 5000 + "a", "a" * 20_000])
def test_pathological_expressions_are_one_line(expression):
    from mechkit.taskarith import TaskVector, evaluate_expression

    with pytest.raises(MechkitError, match="nests too deeply|characters long"):
        evaluate_expression(expression, {"a": TaskVector({"w": torch.ones(1)})})
