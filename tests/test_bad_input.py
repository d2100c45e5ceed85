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


def test_runaway_shots_are_refused_before_any_prompt_is_built():
    import time

    import mechkit as mk
    from mechkit.tasks.prompt import MAX_SHOTS, check_counts

    start = time.perf_counter()
    with pytest.raises(MechkitError, match="shots=100000"):
        mk.build_prompts("capitalize", n=20, shots=100_000)
    assert time.perf_counter() - start < 0.5
    check_counts(1, MAX_SHOTS)  # the bound itself is allowed
    with pytest.raises(MechkitError, match=f"at most {MAX_SHOTS}"):
        check_counts(1, MAX_SHOTS + 1)


def test_a_prompt_longer_than_the_context_is_one_line_not_an_allocation(tiny_llama):
    import mechkit as mk
    from mechkit.actvec import icl_task_vectors

    prompts = mk.build_prompts("capitalize", n=2, shots=200)  # byte tokens: far past tiny's 512 positions
    with pytest.raises(MechkitError, match="longer than the model's context"):
        mk.score_prompts(tiny_llama, prompts)
    with pytest.raises(MechkitError, match="longer than the model's context"):
        icl_task_vectors(tiny_llama, "capitalize", prompts=prompts)


@pytest.mark.parametrize(("grid", "match"), [
    ([[float("nan")] * 4, [0.0] * 4], "NaN"),
    ([[0.1] * 3, [0.0] * 3], "2×3 model"),
    ([["a"] * 4, [0.0] * 4], "not a grid"),
])
def test_a_detect_report_with_odd_scores_is_refused(tiny_llama, grid, match):
    from mechkit.heads import scores_from_report

    report = {"results": {"scores": {"induction": grid}}}
    with pytest.raises(MechkitError, match=match):
        scores_from_report(report, tiny_llama.anatomy, "r.json")
