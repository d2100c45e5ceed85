"""Red-team pass 10 (issue 32), classes 4, 5, 7, 8 and 11: what still failed, fixed as a class.

Each test names the case that failed before its fix. Tiny models only; the option checks run before any model
loads, so most of these cost no forward pass.
"""

from __future__ import annotations

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.model.checks.identity import model_key, tokenizer_sha256
from mechkit.options import OptionError
from mechkit.plugin import Plugin, Result
from mechkit.runner import library_versions


@pytest.fixture(scope="module")
def llama():
    return mk.load_model("tiny:llama")


@pytest.fixture(scope="module")
def task_vector(tmp_path_factory, llama):
    """A capitalize task vector saved by icl-vectors on tiny:llama."""
    out = tmp_path_factory.mktemp("iv")
    mk.run("icl-vectors", model=llama, out=out / "run", tasks="capitalize", method="task-vector", n=2, n_dev=2,
           n_contexts=2, shots=2, layers="0")
    return out / "run" / "capitalize.task-vector.safetensors"


# ---- class 5 / 8: a loaded vector is evaluated as what it is -----------------------------------------------

@pytest.mark.parametrize("options, said", [
    ({"tasks": "past-tense"}, "the loaded vector is capitalize's"),  # was evaluated and saved as past-tense's
    ({"method": "function-vector"}, "the loaded vector is a task-vector"),  # a task vector ran silently
    ({"top_k": 3}, "--top-k chooses how a vector is extracted"),
    ({"fv_scales": "2"}, "--fv-scales chooses"),
    ({"spans": "1,2"}, "--spans chooses"),
    ({"n_contexts": 3}, "--n-contexts chooses"),
    ({"n_cie": 3}, "--n-cie chooses"),
    ({"n_dev": 3}, "--n-dev chooses"),
])
def test_a_loaded_vector_refuses_options_it_would_ignore_or_mislabel(task_vector, options, said):
    with pytest.raises(OptionError, match=said):
        mk.run("icl-vectors", model="tiny:llama", write=False, load_vector=str(task_vector), **options)


def test_a_loaded_vector_with_its_own_task_and_method_still_runs(llama, task_vector):
    run = mk.run("icl-vectors", model=llama, write=False, load_vector=str(task_vector), tasks="capitalize",
                 method="task-vector", n=2, shots=2, layers="0")
    assert run.results["tasks"] == ["capitalize"] and run.results["methods"] == ["task-vector"]


def test_a_file_that_is_not_a_vector_is_refused_before_the_model_loads(tmp_path):
    bad = tmp_path / "v.safetensors"
    bad.write_bytes(b"not safetensors")
    with pytest.raises(OptionError, match="cannot read activation vector"):
        mk.run("icl-vectors", model="tiny:llama", write=False, load_vector=str(bad))


# ---- class 8: options a run would silently ignore are refused --------------------------------------------

@pytest.mark.parametrize("options, said", [
    ({"heads": "0.1", "from_report": "."}, "--from scores heads to rank them"),
    ({"heads": "0.1", "top_k": 3}, "--top-k picks among ranked or random heads"),
    ({"heads": "0.1", "n_seqs": 5}, "--n-seqs scores heads"),
    ({"heads": "random", "seg_len": 7}, "--seg-len scores heads"),
    ({"from_report": ".", "n_seqs": 5}, "--n-seqs sets how heads are scored here"),
])
def test_attention_refuses_what_its_heads_never_read(options, said):
    with pytest.raises(OptionError, match=said):
        mk.run("attention", model="tiny:llama", write=False, **options)


@pytest.mark.parametrize("options, said", [
    ({"shots": 7}, "ioi's pairs have none"),
    ({"clean": "The cat sat", "corrupted": "The dog sat", "answers": "a,b", "task": "capitalize"},
     "--task builds a task's prompt pairs"),
    ({"clean": "The cat sat", "corrupted": "The dog sat", "answers": "a,b", "shots": 3}, "--shots builds"),
])
def test_patch_refuses_what_its_pairs_never_read(options, said):
    with pytest.raises(OptionError, match=said):
        mk.run("patch", model="tiny:llama", write=False, **options)


def test_patch_shots_on_an_icl_task_is_still_taken(llama):
    run = mk.run("patch", model=llama, write=False, task="capitalize", shots=3, pairs=1)
    assert run.results["n_pairs"] == 1


@pytest.mark.parametrize("options, said", [
    ({"parts": "study", "top_k": 3}, "--top-k counts in the components and strengthen parts"),
    ({"parts": "study", "n_contexts": 3}, "--n-contexts counts in the strengthen part"),
    ({"parts": "study", "strengths": "3"}, "--strengths counts in the strengthen part"),
    ({"parts": "study", "effect_shots": 1}, "--effect-shots counts in the components"),
    ({"parts": "components", "treatment": "vector"}, "--treatment counts in the strengthen part"),
    ({"parts": "components", "models": "tiny:gpt2"}, "--models counts in the study and steps parts"),
    ({"parts": "components,strengthen", "n": 3}, "--n counts in the study and steps parts"),
    ({"treatment": "scale", "n_contexts": 3}, "--n-contexts counts for the vector treatment only"),
    ({"method": "exact", "verify": 1}, "--verify checks attribution estimates"),
])
def test_compose_refuses_options_of_parts_it_does_not_run(options, said):
    with pytest.raises(OptionError, match=said):
        mk.run("compose", model="tiny:llama", write=False, **options)


def test_compose_options_of_the_parts_it_runs_are_still_taken():
    from mechkit.options.resolve import resolve_options
    from mechkit.registry import get

    cls = get("compose")
    for options in ({"parts": "study", "n": 2, "seeds": 1, "models": "tiny:gpt2"},
                    {"parts": "components", "top_k": 2, "verify": 1, "n_seqs": 3},
                    {"parts": "strengthen", "treatment": "vector", "n_contexts": 2, "strengths": "2"}):
        resolve_options(cls, options)  # no OptionError


# ---- class 4 / 7: a tokenizer switch that changes ids is part of the identity ----------------------------

def test_split_special_tokens_changes_the_tokenizer_identity_and_the_key(llama):
    tok = llama.tokenizer
    before, key = tokenizer_sha256(tok), model_key(llama)
    assert tok("a<bos>b")["input_ids"] != []
    tok.split_special_tokens = True
    try:
        assert tokenizer_sha256(tok) != before  # the same text now gives other ids: another tokenizer
        assert model_key(llama) != key
    finally:
        tok.split_special_tokens = False
    assert tokenizer_sha256(tok) == before  # off (the default): recorded identities stay as they were


class _Splits(Plugin):
    name = "rt10b-splits"
    version = "0.1"
    summary = "turns the tokenizer's split_special_tokens on and leaves it on"

    def run(self, ctx):
        ctx.model.tokenizer.split_special_tokens = True
        return Result(results={"ok": 1})


def test_a_plugin_leaving_split_special_tokens_on_is_refused():
    handle = mk.load_model("tiny:llama")
    with pytest.raises(MechkitError, match="left the model changed"):
        mk.run(_Splits, model=handle, write=False)


def test_the_resume_key_names_the_libraries_that_make_ids_lora_layers_and_fits():
    assert {"tokenizers", "peft", "scikit-learn"} <= set(library_versions())


# ---- class 11: compose's defaults on a 512-token model are refused before any work, naming --shots that fit --

def test_compose_prompts_too_long_for_the_context_are_refused_before_any_work(monkeypatch):
    import mechkit.compose.analysis as core

    def no_work(*_a, **_k):
        raise AssertionError("work started")

    for name in ("evaluate_cell", "component_effects", "compute_scores"):
        monkeypatch.setattr(core, name, no_work)
    with pytest.raises(MechkitError, match="longer than the model's context") as err:
        mk.run("compose", model="tiny:gpt2", write=False, pairs="capitalize+swap", parts="study", n=1, seeds=1)
    assert err.value.fix.startswith("use --shots 0,2,5:")  # the grid's K that fit: following it runs (below)


def test_following_the_shots_fix_runs():
    run = mk.run("compose", model="tiny:gpt2", write=False, pairs="capitalize+swap", parts="study", n=1, seeds=1,
                 shots="0,2,5")
    assert run.results["shots"] == [0, 2, 5]
