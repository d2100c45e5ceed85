"""Red-team pass 44 (b), fixed.

F1 (silently wrong): a variable a step read and then changed, given in a fresh process exactly the value the
killed run had left in it (or left unset, after ``os.environ.pop``), was taken as unchanged: what a run leaves in
the environment is only its own process's, and a step now says which process it was kept in. F2 (silently wrong): a
``chat_template`` a plugin set and left passed the model-unchanged check, and a later saved model carried it. F3
(wrong fix): a head the shard index mapped to the wrong file was "missing — or set tie_word_embeddings: true",
which loaded the embedding as the head. F4 (over-refusal): a model whose padded vocabulary rows are zero was
"flat" on probe ids no text can make.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
import torch
from rich.console import Console

import mechkit as mk
from mechkit.errors import MechkitError, ModelLoadError
from mechkit.model.sources.tiny import tiny_model

_PLUGIN = '''
import io, os, sys, mechkit as mk
from rich.console import Console
class P(mk.Plugin):
    name, version, summary, needs_model = "rt44b-env-" + sys.argv[2], "0.1", "reads then changes", False
    def run(self, ctx):
        if sys.argv[2] == "pop":
            value = ctx.step("first", lambda: os.environ.pop("RT44B_SCALE", "1"))
        else:
            def change():
                v = os.environ.get("RT44B_SCALE", "a"); os.environ["RT44B_SCALE"] = v + "+"; return v
            value = ctx.step("first", change)
        if os.environ.get("RT44B_KILL") == "1":
            os.kill(os.getpid(), 9)
        return mk.Result(results={"v": value})
log = io.StringIO()
run = mk.run(P, out=sys.argv[1], console=Console(file=log, width=300))
print("RESULT", run.report["results"]["v"], "LOG", log.getvalue().strip())
'''


@pytest.mark.parametrize("how, first, rerun, fresh", [("pop", "2", None, "1"), ("plus", "a", "a+", "a+")])
def test_a_fresh_process_given_what_a_killed_run_left_computes_afresh(tmp_path, how, first, rerun, fresh):
    script = tmp_path / "p.py"
    script.write_text(_PLUGIN)
    base = {k: v for k, v in os.environ.items() if k != "RT44B_SCALE"}
    base |= {"MECHKIT_CACHE": str(tmp_path / "cache"), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    killed = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), how],
                            env={**base, "RT44B_SCALE": first, "RT44B_KILL": "1"}, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    env = base if rerun is None else {**base, "RT44B_SCALE": rerun}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), how], env=env, capture_output=True,
                          text=True, timeout=300)
    assert f"RESULT {fresh} " in done.stdout and "RT44B_SCALE, which the run read, has changed" in done.stdout, \
        done.stdout + done.stderr[-2000:]


def test_a_chat_template_left_changed_is_refused(tmp_path):
    handle = mk.load_model("tiny:llama")

    class SetsTemplate(mk.Plugin):
        name, version, summary, needs_model = "rt44b-template", "0.1", "sets a chat template", True

        def run(self, ctx):
            ctx.model.tokenizer.chat_template = "{{ 'HIJACKED' }}"
            return mk.Result(results={"a": 1})

    with pytest.raises(MechkitError, match="left the model changed"):
        mk.run(SetsTemplate, model=handle, console=Console(file=io.StringIO()))


def test_a_tokenizer_without_a_chat_template_keeps_its_identity():
    from mechkit.model.checks.identity import tokenizer_sha256

    tok = mk.load_model("tiny:llama").tokenizer
    before = tokenizer_sha256(tok)
    tok.chat_template = "{{ x }}"
    assert tokenizer_sha256(tok) != before
    tok.chat_template = None
    assert tokenizer_sha256(tok) == before


def test_a_head_the_index_maps_to_the_wrong_shard_is_named_and_its_fix_loads_the_stored_head(tmp_path):
    model, tok = tiny_model("llama")
    path = tmp_path / "sharded"
    model.save_pretrained(path, max_shard_size="100KB")
    tok.save_pretrained(path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    right = index["weight_map"]["lm_head.weight"]
    wrong = next(f for f in sorted(set(index["weight_map"].values())) if f != right)
    index["weight_map"]["lm_head.weight"] = wrong
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=f"maps lm_head.weight to a file that lacks it, while {right} holds it"):
        mk.load_model(str(path))
    index["weight_map"]["lm_head.weight"] = right
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.equal(mk.load_model(str(path)).model.lm_head.weight, model.lm_head.weight)


def test_zero_padded_vocabulary_rows_are_no_flat_model(tmp_path):
    model, tok = tiny_model("llama", vocab_size=32768)
    with torch.no_grad():
        model.model.embed_tokens.weight[len(tok):] = 0
    path = tmp_path / "padded"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    run = mk.run("inspect", model=str(path), out=tmp_path / "o", console=Console(file=io.StringIO()))
    assert run.report["results"]


def test_a_value_the_user_sets_between_runs_is_theirs_even_equal_to_what_the_run_left(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RT45_SCALE", "1")
    calls, stop = [], [True]

    class Doubles(mk.Plugin):
        name, version, summary, needs_model = "rt45b-doubles", "0.1", "reads, then doubles", False

        def run(self, ctx):
            def compute():
                calls.append(1)
                base = os.environ.get("RT45_SCALE", "1")
                os.environ["RT45_SCALE"] = str(int(base) * 2)
                return base

            value = ctx.step("first", compute)
            if stop:
                raise KeyboardInterrupt
            return mk.Result(results={"v": value})

    with pytest.raises(KeyboardInterrupt):
        mk.run(Doubles, out=tmp_path / "o", console=Console(file=io.StringIO()))
    stop.clear()
    os.environ["RT45_SCALE"] = "2"  # the user's own, between the runs: equal to what the run left
    log = io.StringIO()
    run = mk.run(Doubles, out=tmp_path / "o", console=Console(file=log, width=300))
    assert run.report["results"]["v"] == "2" and len(calls) == 2, log.getvalue()
