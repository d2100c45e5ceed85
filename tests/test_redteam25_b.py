"""Red-team pass 25 (b): a recording that cannot be completed, and what a plugin key's walk did not see.

H1: ``Cache.completion`` returned ``{}`` for a recording it could not run again (through the nnsight backend, of
``inputs_embeds``, with no forward of the whole model), which reads as "nothing is missing", and
``to_transformer_lens()`` silently left out what TransformerLens' tools read (its ``accumulated_resid`` then
KeyErrored inside TL). What is missing is now found first and refused in one line where it cannot be recorded.

H2: a cell's plugin key treated C types made by ``PyType_FromSpec`` (``re.Pattern``, ``operator.itemgetter``,
``array.array``, ``struct.Struct``) as written in Python and read no state of theirs, and keyed a library's
decorator wrapper (``@torch.no_grad()``, ``@contextlib.contextmanager``) by its name, hiding the user's body: an
edited pattern or helper resumed on steps the old one computed.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.hooking.cache import Cache
from mechkit.plugin_key import plugin_code
from tests.conftest import kill_then_rerun

# ---- H1: a recording that cannot be run again refuses what it lacks ------------------------------------------

MISSING = ["blocks.1.hook_resid_post", "blocks.*.hook_resid_pre", ["blocks.0.hook_attn_out", "blocks.1.attn.hook_z"]]


@pytest.fixture(scope="module")
def traced():
    pytest.importorskip("nnsight", reason="the nnsight backend is optional")
    m = mk.load_model("tiny:llama", backend="nnsight", device="cpu")
    return m, m.to_tokens("hello world")


@pytest.mark.parametrize("pattern", MISSING, ids=str)
def test_a_recording_through_nnsight_refuses_what_it_lacks(traced, pattern):
    m, ids = traced
    _, cache = mk.run_with_cache(m, ids, "blocks.0.attn.hook_z")
    with pytest.raises(MechkitError, match="lacks .* recorded through the nnsight backend.*native backend"):
        cache.completion(pattern)
    assert cache.completion("blocks.0.attn.hook_z") == {}  # nothing missing: still nothing to do


def test_a_recording_through_nnsight_is_not_converted_without_what_transformer_lens_needs(traced):
    pytest.importorskip("transformer_lens", reason="TransformerLens is an optional engine")
    m, ids = traced
    _, cache = mk.run_with_cache(m, ids, "blocks.0.attn.hook_z")
    with pytest.raises(MechkitError, match="lacks .* nnsight backend"):
        cache.to_transformer_lens()


def test_a_full_nnsight_recording_converts_without_the_points_nnsight_cannot_record(traced, llama):
    pytest.importorskip("transformer_lens", reason="TransformerLens is an optional engine")
    m, ids = traced
    _, cache = mk.run_with_cache(m, ids)  # every point nnsight serves; resid_mid and ln_final's scale it cannot
    tl = cache.to_transformer_lens()
    assert "blocks.0.hook_resid_mid" not in tl and "blocks.1.hook_resid_post" in tl
    _, native = mk.run_with_cache(llama, ids, "blocks.*.hook_resid_pre")
    resid, _ = tl.accumulated_resid(return_labels=True)  # TransformerLens' own tool, on the converted recording
    assert torch.allclose(resid[0], native["blocks.0.hook_resid_pre"], atol=1e-5)


def _embedded(llama, names):
    ids = llama.to_tokens("hello world")
    with torch.no_grad(), mk.record(llama, names) as cache:
        llama.model(inputs_embeds=llama.model.get_input_embeddings()(ids))
    return cache


@pytest.mark.parametrize("pattern", MISSING, ids=str)
def test_a_recording_of_inputs_embeds_refuses_what_it_lacks(llama, pattern):
    cache = _embedded(llama, "blocks.0.hook_resid_post")
    with pytest.raises(MechkitError, match="lacks .* other inputs than token ids"):
        cache.completion(pattern)
    assert cache.completion("blocks.0.hook_resid_post") == {}


def test_a_recording_of_inputs_embeds_converts_only_when_it_holds_what_transformer_lens_needs(llama):
    pytest.importorskip("transformer_lens", reason="TransformerLens is an optional engine")
    with pytest.raises(MechkitError, match="lacks .* other inputs than token ids"):
        _embedded(llama, "blocks.0.hook_resid_post").to_transformer_lens()
    tl = _embedded(llama, "*").to_transformer_lens()  # everything recorded in that run: nothing to complete
    assert tl.accumulated_resid().shape[0] == llama.anatomy.n_layers + 1


@pytest.mark.parametrize("pattern", MISSING, ids=str)
def test_a_recording_with_no_forward_of_the_model_refuses_what_it_lacks(llama, pattern):
    with mk.record(llama, "blocks.0.hook_resid_post") as cache:
        pass  # nothing ran: no token ids kept
    with pytest.raises(MechkitError, match="lacks .* kept no token ids"):
        cache.completion(pattern)
    by_hand = Cache({"blocks.0.hook_resid_post": torch.ones(1, 2, 64)})
    by_hand.handle = llama  # a model but no inputs
    with pytest.raises(MechkitError, match="lacks .* kept no token ids"):
        by_hand.completion(pattern)


@pytest.mark.parametrize("name", ["blocks.1.hook_resid_post", "hook_embed", "blocks.3.attn.hook_z"])
def test_a_cache_built_by_hand_refuses_a_full_name_it_lacks(name):
    cache = Cache({"blocks.0.hook_resid_post": torch.ones(1)})
    with pytest.raises(MechkitError, match=f"lacks {name}.* knows no model"):
        cache.completion(["blocks.0.hook_resid_post", name])
    assert cache.completion("blocks.0.hook_resid_post") == {}


# ---- H2: C heap types and a library's decorator wrappers in a cell's key ------------------------------------

_PLUGIN = """
class P(mk.Plugin):
    name, version, summary = "rt25b-cell", "0.1", "t"
    def run(self, ctx):
        return mk.Result(results={{"a": ctx.step("a", lambda: {reads})}}, finding="ok")
"""


def _cell(source: str, value: str) -> type:
    namespace = {"mk": mk, "torch": torch}
    exec(compile(source.replace("{v}", value), "<cell>", "exec"), namespace)
    return namespace["P"]


EDITS = {
    "re.Pattern": ("import re\nPAT = re.compile(r'{v}')\n", "PAT.pattern"),
    "operator.itemgetter": ("import operator\nGET = operator.itemgetter('{v}')\n", "GET({'one': 1, 'two': 2})"),
    "operator.attrgetter": ("import operator\nGET = operator.attrgetter('{v}')\n", "GET"),
    "array.array": ("import array\nARR = array.array('u', '{v}')\n", "ARR.tounicode()"),
    "struct.Struct": ("import struct\nFMT = struct.Struct('{v}')\n", "FMT.size"),
    "@torch.no_grad()": ("@torch.no_grad()\ndef helper():\n    return '{v}'\n", "helper()"),
    "@torch.inference_mode()": ("@torch.inference_mode()\ndef helper():\n    return '{v}'\n", "helper()"),
    "@torch.enable_grad()": ("@torch.enable_grad()\ndef helper():\n    return '{v}'\n", "helper()"),
    "@contextlib.contextmanager": ("import contextlib\n@contextlib.contextmanager\ndef helper():\n    yield '{v}'\n",
                                   "helper().__enter__()"),
}
VALUES = {"struct.Struct": ("i", "q"), "operator.itemgetter": ("one", "two")}


@pytest.mark.parametrize("kind", sorted(EDITS))
def test_a_c_heap_object_or_a_wrapped_helper_edited_gets_another_key(kind):
    pre, reads = EDITS[kind]
    one, two = VALUES.get(kind, ("one", "two"))
    source = pre + _PLUGIN.format(reads=reads)
    first = plugin_code(_cell(source, one))
    assert plugin_code(_cell(source, one)) == first  # the same cell: it resumes
    assert plugin_code(_cell(source, two)) != first, kind  # edited between the kill and the rerun: it starts fresh


def test_a_cell_with_an_edited_pattern_and_wrapped_helper_killed_after_its_steps_does_not_resume_them(tmp_path):
    script = tmp_path / "cell.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import mechkit as mk
        val = sys.argv[1]; g = {"mk": mk, "os": os}
        exec(compile(f'''
        import re, torch
        PAT = re.compile(r"{val}")
        @torch.no_grad()
        def helper():
            return "{val}"
        class P(mk.Plugin):
            name = "rt25b-e2e"; version = "0.1"; summary = "t"
            def run(self, ctx):
                a = ctx.step("a", lambda: PAT.pattern)
                b = ctx.step("b", lambda: helper())
                if os.environ.get("RT25B_KILL"):
                    os._exit(9)
                return mk.Result(results={{"a": a, "b": b, "now": PAT.pattern + helper()}}, finding="x")
        ''', "<cell>", "exec"), g)
        print(mk.run(g["P"], model="tiny:llama", out=sys.argv[2], force=True).results)
    """))
    assert kill_then_rerun(script, tmp_path, "one", "two", "RT25B_KILL") == "{'a': 'two', 'b': 'two', 'now': 'twotwo'}"
