"""Red-team pass 38 (b), what I fixed of it: patch checked its prompts against the context only inside its first
step, with a generic fix telling fewer --shots below its least (2) or to ioi, which has none (F3). F1/F2 (a file
opened with ``dir_fd``, a variable read through ``os.environb``) are in test_resume_reads.py."""

from __future__ import annotations

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import tiny_model_dir


@pytest.fixture(scope="module")
def gpt2_40(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("g40") / "m", "gpt2", n_positions=40)


@pytest.mark.parametrize(("options", "said"), [
    ({}, "use a model with a longer context (even 0-shot prompts are"),
    ({"task": "capitalize", "shots": 2}, "--shots 2 is the fewest this command allows, and its prompts do not fit"),
    ({"task": "capitalize", "shots": 5}, "not even --shots 2, the fewest this command allows, fits"),
])
def test_patch_checks_its_prompts_against_the_context_before_any_step(gpt2_40, options, said):
    with pytest.raises(MechkitError) as info:
        mk.run("patch", model=str(gpt2_40), write=False, **options)
    assert said in str(info.value) and "fewer --shots or a shorter" not in str(info.value)
