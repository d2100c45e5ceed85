"""Red-team pass 29 (b): what it found, fixed.

F1: a file added to a GGUF cache entry (``special_tokens_map.json``, ``generation_config.json``...) was loaded
as part of the user's GGUF; F2a: so was a file dropped from the entry's own list. F3: a LongRoPE's long set
deleted with a tensor put on its class passed as "dropped" (transformers' ``getattr`` then reads the class's);
set to None (which transformers recomputes, like a deleted one) it was refused. F4: a helper imported by
``import_module(name="h")`` was not in the resume key; F5: nor one run by ``runpy.run_module("h")``, or loaded
by its file name (``runpy.run_path``, ``exec(open(...))``, ``spec_from_file_location``). F6: on a one-head
model, ablate's refusal suggested ``--top-k 0``, below the option's minimum.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.model.sources import gguf as gguf_mod
from mechkit.model.sources.tiny import byte_tokenizer, tiny_model
from mechkit.plugin_key import plugin_code
from tests.conftest import LONGROPE, cli_in_process, edit_plugin, forwards, tiny_model_dir

# --- F1 / F2a: a GGUF cache entry holds only what was written -----------------------------------------------------


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A .gguf file whose "conversion" is a seeded tiny Llama (the cache logic alone), and a count of builds."""
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_mod, "RACY_NS", 0)
    builds: list = []
    monkeypatch.setattr(gguf_mod, "load_gguf", lambda path, dtype=None: builds.append(path) or tiny_model("llama"))
    f = tmp_path / "fake.gguf"
    f.write_bytes(b"GGUF fake model bytes")
    return f, builds


@pytest.mark.parametrize("name,content", [
    ("special_tokens_map.json", {"bos_token": "<evil>"}), ("added_tokens.json", {"zzzevil": 5}),
    ("generation_config.json", {"do_sample": True, "temperature": 9.0}), ("chat_template.jinja", "{{ evil }}"),
])
def test_a_file_added_to_a_gguf_entry_makes_it_convert_again(fake_gguf, name, content):
    f, builds = fake_gguf
    first = mk.load_model(str(f))
    (first.source / name).write_text(content if isinstance(content, str) else json.dumps(content))
    again = mk.load_model(str(f))
    assert len(builds) == 2 and not (again.source / name).exists()


def test_a_file_dropped_from_the_entrys_list_makes_it_convert_again(fake_gguf):
    f, builds = fake_gguf
    entry = mk.load_model(str(f)).source
    meta = json.loads((entry / gguf_mod.META).read_text())
    dropped = next(n for n in meta["files"] if n not in gguf_mod.REQUIRED)
    del meta["files"][dropped]
    (entry / gguf_mod.META).write_text(json.dumps(meta))
    (entry / dropped).write_text((entry / dropped).read_text() + " ")
    mk.load_model(str(f))
    assert len(builds) == 2


def test_a_whole_entry_is_read_without_a_rebuild(fake_gguf):
    f, builds = fake_gguf
    mk.load_model(str(f))
    mk.load_model(str(f))
    assert len(builds) == 1


# --- F3: a LongRoPE's long set read as the forward reads it ---------------------------------------------------------


@pytest.fixture(scope="module")
def longrope_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("long") / "m", "phi3", **LONGROPE)


def _run(edit, handle):
    return mk.run(edit_plugin(edit, "rt29b-edit"), model=handle, write=False)


def test_a_long_set_deleted_with_a_tensor_on_the_class_is_refused(longrope_dir):
    h = mk.load_model(str(longrope_dir))
    forwards(40)(h)
    rope_class = type(h.model.model.rotary_emb)

    def edit(m):
        del m.model.model.rotary_emb.long_inv_freq
        rope_class.long_inv_freq = torch.ones(8)

    try:
        with pytest.raises(MechkitError, match="its buffer model.rotary_emb.long_inv_freq was set on the class"):
            _run(edit, h)
    finally:
        del rope_class.long_inv_freq


@pytest.mark.parametrize("before", [(), (40,)])
def test_a_long_set_set_to_none_passes_as_transformers_recomputes_it(longrope_dir, before):
    h = mk.load_model(str(longrope_dir))
    forwards(*before)(h)
    ids = torch.arange(3, 43)[None]
    with torch.no_grad():
        expected = h.model(ids).logits

    def drop(m):
        m.model.model.rotary_emb.long_inv_freq = None

    assert all(_run(drop, h).report["checks"].values())
    with torch.no_grad():
        assert torch.equal(h.model(ids).logits, expected)


# --- F4 / F5: a helper loaded by name or by file name is in the key -------------------------------------------------

LOADERS = {
    "import_module(name=)": ("import importlib\n", "importlib.import_module(name='{m}').VALUE"),
    "__import__(name=)": ("", "__import__(name='{m}').VALUE"),
    "runpy.run_module": ("import runpy\n", "runpy.run_module('{m}')['VALUE']"),
    "runpy.run_path": ("import os, runpy\nHERE = os.path.dirname(os.path.abspath(__file__))\n",
                       "runpy.run_path(os.path.join(HERE, '{m}.py'))['VALUE']"),
    "exec(open())": ("import os\nHERE = os.path.dirname(os.path.abspath(__file__))\n",
                     "(lambda g: (exec(open(os.path.join(HERE, '{m}.py')).read(), g), g['VALUE'])[1])({{}})"),
    "spec_from_file_location": (
        "import importlib.util, os\nHERE = os.path.dirname(os.path.abspath(__file__))\n",
        "(lambda s: (s.loader.exec_module(m := importlib.util.module_from_spec(s)), m.VALUE)[1])("
        "importlib.util.spec_from_file_location('{m}', os.path.join(HERE, '{m}.py')))"),
}

PLUGIN = """
class P(mk.Plugin):
    name, version, summary = "rt29b-loader", "0.1", "t"
    def run(self, ctx):
        return mk.Result(results={{"v": ctx.step("a", lambda: {call})}}, finding="ok")
"""


@pytest.mark.parametrize("how", sorted(LOADERS))
def test_a_helper_loaded_by_name_or_by_file_name_edited_gets_another_key(tmp_path, monkeypatch, how):
    tag = sorted(LOADERS).index(how)
    module, helper = f"rt29b_plug_{tag}", f"rt29b_help_{tag}"
    pre, call = LOADERS[how]
    (tmp_path / f"{module}.py").write_text("import mechkit as mk\n" + pre + textwrap.dedent(
        PLUGIN.format(call=call.format(m=helper))))
    (tmp_path / f"{helper}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cls = __import__(module).P
        first = plugin_code(cls)
        assert plugin_code(cls) == first
        (tmp_path / f"{helper}.py").write_text("VALUE = 2\n")
        assert plugin_code(cls) != first
    finally:
        for name in (module, helper):
            sys.modules.pop(name, None)


def test_a_string_that_names_no_file_of_the_users_leaves_the_key_alone(tmp_path, monkeypatch):
    (tmp_path / "rt29b_plain.py").write_text("import mechkit as mk\nNOTE = 'setup.py'\nOTHER = 'os.py'\n"
                                             + textwrap.dedent(PLUGIN.format(call="1")))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cls = __import__("rt29b_plain").P
        first = plugin_code(cls)
        (tmp_path / "unrelated.py").write_text("VALUE = 3\n")
        assert plugin_code(cls) == first
    finally:
        sys.modules.pop("rt29b_plain", None)


# --- F6: a one-head model's baseline fix -----------------------------------------------------------------------------


def test_a_one_head_models_baseline_refusal_suggests_only_what_works(tmp_path):
    model, _ = tiny_model("llama", num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1)
    model.save_pretrained(tmp_path / "m")
    byte_tokenizer().save_pretrained(tmp_path / "m")
    args = ["ablate", "--model", str(tmp_path / "m"), "--n", "2", "--shots", "1"]
    refused = cli_in_process(*args, "--out", str(tmp_path / "a1"))
    assert refused.returncode == 2 and "--top-k 0" not in refused.stderr
    assert "pass --baseline none" in refused.stderr or "--baseline none" in refused.stderr
    fixed = cli_in_process(*args, "--baseline", "none", "--out", str(tmp_path / "a2"))
    assert fixed.returncode == 0, fixed.stderr


def test_an_explicit_spec_is_told_to_name_fewer_heads_not_to_lower_top_k():
    from mechkit.model.headspec import parse_spec

    spec = parse_spec("0.0,0.1,0.2")
    with pytest.raises(MechkitError) as err:
        spec.check_baseline(1, 4, [3], other=", or --baseline none")
    assert "name at most 2 heads in --heads, or --baseline none" in str(err.value)
    assert "--top-k" not in str(err.value)
