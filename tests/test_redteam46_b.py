"""Red-team pass 46 (b), fixed.

F1 (silently wrong): a tokenizer's chat template held as a dict of named templates (as transformers holds them)
was left out of the tokenizer's identity, which kept plain values only: a plugin that set one, or edited one in
place, passed the model-unchanged check. F2 (silently wrong): the flat-logits refusal compared the whole padded
vocabulary, so a head of zeros over every token text can make passed where the padded rows past it differ.
"""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.model.checks.identity import tokenizer_sha256
from mechkit.model.sources.tiny import tiny_model


def _run(plugin, handle):
    return mk.run(plugin, model=handle, console=Console(file=io.StringIO()))


@pytest.mark.parametrize("before", [None, {"default": "{{ 'a' }}"}])
def test_a_dict_of_chat_templates_a_plugin_sets_or_edits_is_a_change(before):
    handle = mk.load_model("tiny:llama")
    handle.tokenizer.chat_template = before

    class SetsTemplates(mk.Plugin):
        name, version, summary, needs_model = "rt46b-templates", "0.1", "sets named chat templates", True

        def run(self, ctx):
            if before is None:
                ctx.model.tokenizer.chat_template = {"default": "{{ 'HIJACKED' }}", "tool_use": "{{ 'X' }}"}
            else:
                ctx.model.tokenizer.chat_template["default"] = "{{ 'HIJACKED' }}"  # in place
            return mk.Result(results={"a": 1})

    with pytest.raises(MechkitError, match="left the model changed"):
        _run(SetsTemplates, handle)


def test_using_a_dict_of_chat_templates_is_no_change():
    handle = mk.load_model("tiny:llama")
    handle.tokenizer.chat_template = {"default": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}

    class Uses(mk.Plugin):
        name, version, summary, needs_model = "rt46b-uses", "0.1", "applies the chat template", True

        def run(self, ctx):
            text = ctx.model.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
            return mk.Result(results={"text": text})

    assert _run(Uses, handle).report["results"] == {"text": "hi"}


def test_a_dict_template_is_in_the_tokenizers_identity_and_an_unwritable_one_still_counts():
    tok = mk.load_model("tiny:llama").tokenizer
    none = tokenizer_sha256(tok)
    tok.chat_template = {"default": "{{ a }}"}
    first = tokenizer_sha256(tok)
    tok.chat_template = {"default": "{{ b }}"}
    assert len({none, first, tokenizer_sha256(tok)}) == 3
    tok.chat_template = {"default": object()}  # JSON cannot write it: recorded by its type, never its address
    assert tokenizer_sha256(tok) not in (none, first) and tokenizer_sha256(tok) == tokenizer_sha256(tok)


def test_a_head_flat_over_the_tokens_text_makes_is_refused_whatever_its_padded_rows(tmp_path):
    model, tok = tiny_model("llama")
    model.resize_token_embeddings(len(tok) + 61, mean_resizing=False)
    with torch.no_grad():
        model.lm_head.weight[:len(tok)].zero_()
        model.lm_head.weight[len(tok):].normal_()  # rows no text can make: they differ
    path = tmp_path / "flatpad"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    with pytest.raises(MechkitError, match="computes the same logit for every token"):
        mk.run("detect", model=str(path), out=tmp_path / "o", console=Console(file=io.StringIO()))
    assert not (tmp_path / "o").exists()


def test_a_working_head_with_flat_padded_rows_runs(tmp_path):
    model, tok = tiny_model("llama")
    model.resize_token_embeddings(len(tok) + 61, mean_resizing=False)
    with torch.no_grad():
        model.lm_head.weight[len(tok):].zero_()
    path = tmp_path / "padded"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    assert mk.run("inspect", model=str(path), out=tmp_path / "o", console=Console(file=io.StringIO())).report
