"""Red-team pass 13 (helper a): the logit lens and DLA on odd caches, positions and answer ids; a Cache of
forwards of different lengths; patch's empty answers and identical prompts (issue 32)."""

from __future__ import annotations

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.patching import direct_logit_attribution, dla_names, lens_names, logit_lens


def test_lens_and_dla_name_what_the_cache_lacks(llama):
    _, cache = mk.run_with_cache(llama, llama.to_tokens("hi"), "blocks.0.hook_resid_pre")
    with pytest.raises(MechkitError, match="lacks: blocks.1.hook_resid_pre.*lens_names"):
        logit_lens(llama, cache)
    with pytest.raises(MechkitError, match="lacks: blocks.0.attn.hook_z.*dla_names"):
        direct_logit_attribution(llama, cache, 5, 6)


@pytest.mark.parametrize("cache", [None, 3, "cache"])
def test_lens_refuses_what_is_not_a_recording(llama, cache):
    with pytest.raises(MechkitError, match="takes a recording"):
        logit_lens(llama, cache)


def test_lens_refuses_a_dict_of_recorded_parts(llama, recorded):
    with pytest.raises(MechkitError, match="not a \\[batch, pos"):
        logit_lens(llama, {name: [act] for name, act in recorded[1].items()})  # lists of parts, not tensors
    # dict(cache) reads through Cache.__getitem__ (pass 14): tensors, so the lens runs on it
    assert torch.equal(logit_lens(llama, dict(recorded[1])), logit_lens(llama, recorded[1]))


def test_lens_refuses_no_model(recorded):
    with pytest.raises(MechkitError, match="needs a loaded model"):
        logit_lens(None, recorded[1])


@pytest.mark.parametrize("pos", [11, -12, 100, 1.5, slice(0, 2), True])
def test_lens_and_dla_refuse_positions_outside_the_prompt(llama, recorded, pos):
    assert recorded[0].shape[1] == 11
    with pytest.raises(MechkitError, match="pos"):
        logit_lens(llama, recorded[1], pos=pos)
    with pytest.raises(MechkitError, match="pos"):
        direct_logit_attribution(llama, recorded[1], 5, 6, pos=pos)


def test_lens_takes_the_first_and_a_tensor_position(llama, recorded):
    first = logit_lens(llama, recorded[1], pos=-11)
    assert torch.equal(first, logit_lens(llama, recorded[1], pos=0))
    assert torch.equal(logit_lens(llama, recorded[1], pos=torch.tensor(3)), logit_lens(llama, recorded[1], pos=3))


@pytest.mark.parametrize("token", [-1, 259, 10**6, "a", 5.0, True])
def test_dla_refuses_answer_ids_outside_the_unembedding(llama, recorded, token):
    # -1 used to read the last row silently; True the wrong shape; the rest raw errors
    with pytest.raises(MechkitError, match="not a token id"):
        direct_logit_attribution(llama, recorded[1], token, 6)
    with pytest.raises(MechkitError, match="not a token id"):
        direct_logit_attribution(llama, recorded[1], 5, token)


def test_lens_and_dla_refuse_a_cache_of_another_model(llama):
    gpt2 = mk.load_model("tiny:gpt2")  # the same width as tiny:llama: nothing else would notice
    _, cache = mk.run_with_cache(gpt2, gpt2.to_tokens("hello"), dla_names(gpt2))
    with pytest.raises(MechkitError, match="recorded on tiny:gpt2, not on tiny:llama"):
        logit_lens(llama, cache)
    with pytest.raises(MechkitError, match="recorded on tiny:gpt2"):
        direct_logit_attribution(llama, cache, 5, 6)


def test_lens_accepts_a_transformer_lens_cache(llama, recorded):
    tl = recorded[1].to_transformer_lens()
    assert torch.allclose(logit_lens(llama, tl), logit_lens(llama, recorded[1]))


def test_cache_of_forwards_of_different_lengths_says_so(llama):
    with torch.no_grad(), mk.record(llama, lens_names(llama)) as cache:
        llama(llama.to_tokens("hi"))
        llama(llama.to_tokens("hello there"))
    with pytest.raises(MechkitError, match="different shapes.*each in its own mk.record"):
        cache["blocks.0.hook_resid_pre"]
    with pytest.raises(MechkitError, match="different shapes"):
        logit_lens(llama, cache)


def test_answer_id_of_empty_text(llama):
    from mechkit.patching import answer_id

    with pytest.raises(MechkitError, match="no token at all"):
        answer_id(llama, "")


@pytest.mark.parametrize(("args", "message"), [
    (["--clean", "ab", "--corrupted", "ac", "--answers", ","], "an answer is empty"),
    (["--clean", "ab", "--corrupted", "ac", "--answers", "d,"], "an answer is empty"),
    (["--clean", "ab", "--corrupted", "ab", "--answers", "d,e"], "the same text"),
])
def test_patch_refuses_empty_answers_and_identical_prompts_before_the_model(args, message, tmp_path):
    from tests.conftest import cli_in_process

    # a model that does not exist: the refusal must come before it would be looked up
    result = cli_in_process("patch", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()


def test_report_show_of_the_html_names_the_right_path(tmp_path):
    from tests.conftest import cli_in_process

    (tmp_path / "report.html").write_text("<html></html>")
    result = cli_in_process("report", "show", str(tmp_path / "report.html"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "or its run directory" in result.stderr and "rerun the analysis" not in result.stderr
    (tmp_path / "report.json").write_text('{"schema": ')  # a truncated report: rerun is the fix
    assert "rerun the analysis" in cli_in_process("report", "show", str(tmp_path)).stderr


def test_lens_refuses_a_cache_of_another_in_memory_model_of_one_class():
    import transformers as T

    from mechkit.model.sources.tiny import SPECIAL_TOKENS, byte_tokenizer

    def fresh(seed: int) -> mk.ModelHandle:
        torch.manual_seed(seed)
        config = T.LlamaConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               **SPECIAL_TOKENS)
        return mk.load_model(T.AutoModelForCausalLM.from_config(config).eval(), tokenizer=byte_tokenizer())

    a, b = fresh(0), fresh(1)
    assert a.spec == b.spec  # both name only the class
    _, cache = mk.run_with_cache(a, a.to_tokens("hi"), lens_names(a))
    assert logit_lens(a, cache).shape[0] == 3
    with pytest.raises(MechkitError, match="this cache was recorded on"):
        logit_lens(b, cache)


def test_run_with_cache_of_everything_on_nnsight_records_what_it_serves(llama):
    nn = mk.load_model("tiny:llama", backend="nnsight")
    ids = llama.to_tokens("hello")
    logits, cache = mk.run_with_cache(nn, ids)  # was refused: the default named points nnsight lacks
    native_logits, native = mk.run_with_cache(llama, ids)
    assert len(cache) > 2 * llama.anatomy.n_layers and set(cache) < set(native)
    assert torch.allclose(logits, native_logits, atol=1e-5)
    for name in cache:
        assert torch.allclose(cache[name], native[name], atol=1e-5), name
    with pytest.raises(MechkitError, match="not served by the nnsight"):  # named: still refused
        mk.run_with_cache(nn, ids, "blocks.0.attn.hook_q")


def test_a_set_of_hook_names_is_recorded_like_a_list():
    """Pass 13's note: mk.record(m, {name}) was refused though a tuple was accepted."""
    m = mk.load_model("tiny:llama", device="cpu")
    ids = m.to_tokens("abc")
    _, by_set = mk.run_with_cache(m, ids, {"blocks.0.hook_resid_pre", "blocks.1.hook_resid_post"})
    _, by_list = mk.run_with_cache(m, ids, ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_post"])
    assert set(by_set) == set(by_list) and all(torch.equal(by_set[k], by_list[k]) for k in by_list)
