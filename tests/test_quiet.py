"""A normal run prints mechkit's output and nothing from third-party libraries; ``--verbose`` brings it
back; progress shows as plain lines where stderr is not a terminal; one seam names the KV cache."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
import warnings

import pytest

from mechkit.io.progress import PlainProgress
from mechkit.io.quiet import quiet
from tests.conftest import noisy_model_dir

# What third-party chatter looks like on stderr: a warning, a deprecation note, a tqdm bar.
NOISE = re.compile(r"Warning|deprecated|it/s\]|\d+%\|", re.IGNORECASE)


def _cli(*args: str, verbose: bool = False) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "mechkit.cli.main", *args, *(["--verbose"] if verbose else [])]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600,
                          env={**_env(), "PYTHONWARNINGS": "default"})  # warnings shown unless mechkit hides them


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "MECHKIT_VERBOSE"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny model saved as a directory: it loads through ``from_pretrained``, which draws transformers'
    "Loading weights" bar, and fine-tuning it makes peft read a deprecated transformers property."""
    return noisy_model_dir(tmp_path_factory.mktemp("model") / "tiny")


@pytest.mark.parametrize("command", [
    ["finetune", "--task", "capitalize", "--steps", "2", "--batch-size", "2", "--eval-n", "2", "--method", "lora"],
    ["ablate", "--heads", "0.0,1.1", "--tasks", "capitalize", "--n", "2", "--shots", "1"],
])
def test_a_normal_run_prints_no_third_party_warning_or_bar(model_dir, tmp_path, command):
    result = _cli(*command, "--model", str(model_dir), "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert "report:" in result.stdout
    noise = [line for line in result.stderr.splitlines() if NOISE.search(line)]
    assert not noise, "third-party output on a normal run:\n" + "\n".join(noise)


def test_verbose_shows_the_third_party_output_again(model_dir, tmp_path):
    command = ["finetune", "--task", "capitalize", "--steps", "2", "--batch-size", "2", "--eval-n", "2",
               "--method", "lora", "--model", str(model_dir), "--out", str(tmp_path / "run")]
    result = _cli(*command, verbose=True)
    assert result.returncode == 0, result.stderr
    assert NOISE.search(result.stderr), "--verbose showed nothing: the quiet test above would prove nothing"


def test_quiet_hides_library_deprecations_keeps_user_warnings_and_restores_everything():
    import logging

    import tqdm

    lg = logging.getLogger("transformers")
    level, init = lg.level, tqdm.std.tqdm.__dict__["__init__"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet():
            warnings.warn("old API", FutureWarning, stacklevel=1)
            warnings.warn("old API", DeprecationWarning, stacklevel=1)
            warnings.warn("a NaN in your metric", RuntimeWarning, stacklevel=1)
            assert lg.getEffectiveLevel() == logging.ERROR
            assert tqdm.tqdm(range(3)).disable
        warnings.warn("after", FutureWarning, stacklevel=1)
    assert [type(w.message) for w in seen] == [RuntimeWarning, FutureWarning]
    assert lg.level == level and tqdm.std.tqdm.__dict__["__init__"] is init
    assert not tqdm.tqdm(range(3), file=io.StringIO()).disable


def test_quiet_keeps_the_load_report_of_missing_weights():
    import logging

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    report = logging.getLogger("transformers.utils.loading_report")
    handler = Keep()
    report.addHandler(handler)
    try:
        with quiet():
            report.warning("LlamaForCausalLM LOAD REPORT\nmodel.norm.weight | MISSING")
            report.warning("lm_head.bias | UNEXPECTED")
    finally:
        report.removeHandler(handler)
    assert records == ["LlamaForCausalLM LOAD REPORT\nmodel.norm.weight | MISSING"]


def test_progress_prints_plain_lines_at_least_every_interval_off_a_terminal():
    out = io.StringIO()
    with PlainProgress(out, every=0.05) as bar:
        job = bar.add_task("slow step", total=2)
        time.sleep(0.3)  # one step that takes six intervals: the timer still reports
        bar.advance(job)
        bar.advance(job)
    lines = out.getvalue().splitlines()
    assert sum(line.startswith("mechkit: slow step 0/2 (elapsed") for line in lines) >= 3
    assert lines[-1].startswith("mechkit: slow step 2/2 done")


def test_a_plugin_run_into_a_pipe_shows_plain_progress(tmp_path):
    result = _cli("ablate", "--model", "tiny:llama", "--heads", "0.0,1.1", "--tasks", "capitalize", "--n", "2",
                  "--shots", "1", "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert re.search(r"^mechkit: ablate \(conditions\) \d+/\d+ done \(elapsed", result.stderr, re.MULTILINE)


def test_the_cache_seam_names_what_the_installed_transformers_uses():
    from transformers.modeling_outputs import CausalLMOutputWithPast

    import mechkit as mk
    from mechkit.model.compat import cache_kwargs, cache_name, cache_of

    assert cache_name() in CausalLMOutputWithPast.__dataclass_fields__
    m = mk.load_model("tiny:llama")
    ids = m.to_tokens("hello there")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the old name warns from transformers 5.24 on
        full = m.forward(ids, use_cache=False).logits[:, -1]
        first = m.forward(ids[:, :-1], use_cache=True)
        step = m.forward(ids[:, -1:], **cache_kwargs(cache_of(first)), use_cache=True).logits[:, -1]
    assert cache_of(first) is not None
    assert (full - step).abs().max() < 1e-4
