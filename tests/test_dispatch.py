"""One model over several devices, CPU memory and disk (accelerate's big-model dispatch).

Every analysis gives the same numbers on a dispatched model as on the same model on one device.
On this CPU-only machine "dispatched" means: part of the layers offloaded to disk (their parameters
on ``meta``, their weights memory-mapped from the offload folder and loaded for each forward), and
the whole model CPU-offloaded from ``meta`` (accelerate's ``cpu_offload``: weights kept in a CPU
state dict its hooks load from). accelerate's float path is the same kernels on the same CPU, so
the results are bit-identical (``torch.equal``), not merely close; the GPU tests compare at 1e-5
(the GPU's kernels differ from the CPU's).
"""

from __future__ import annotations

import os

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.model.headspec import Head
from mechkit.model.placement.request import DispatchError
from mechkit.model.placement.stored import module_tensor, stored_tensor
from mechkit.model.sources.tiny import tiny_model

# the second layer and the unembedding on disk, the rest in memory
LLAMA_DISK = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
              "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "disk"}
GPT2_DISK = {"transformer.wte": "disk", "lm_head": "disk", "transformer.wpe": "cpu", "transformer.drop": "cpu",
             "transformer.h.0": "cpu", "transformer.h.1": "disk", "transformer.ln_f": "cpu"}


def _logits(handle, ids):
    with torch.no_grad():
        return handle(ids)


def _meta(handle) -> list[str]:
    return [n for n, p in handle.model.named_parameters() if p.device.type == "meta"]


def _cpu_offloaded(family: str):
    """Every weight on meta, kept in CPU memory by accelerate's hooks (``cpu_offload``)."""
    from accelerate import cpu_offload

    model, tok = tiny_model(family)
    cpu_offload(model, execution_device=torch.device("cpu"))
    return mk.load_model(model, tokenizer=tok)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("offload")


@pytest.fixture(scope="module")
def base():
    return mk.load_model("tiny:llama", device="cpu")


@pytest.fixture(scope="module")
def disk(folder):
    return mk.load_model("tiny:llama", device_map=LLAMA_DISK, offload_folder=folder)


@pytest.fixture(scope="module")
def cpu_off():
    return _cpu_offloaded("llama")


@pytest.fixture(scope="module", params=["disk", "cpu_off"])
def dispatched(request, disk, cpu_off):
    return {"disk": disk, "cpu_off": cpu_off}[request.param]


@pytest.fixture
def ids():
    return torch.randint(0, 256, (3, 11), generator=torch.Generator().manual_seed(0))


def test_dispatched_forward_and_weights_hash_equal_the_plain_model(base, disk, cpu_off, ids):
    assert set(_meta(disk)) == {n for n, _ in disk.model.named_parameters()
                                if n.startswith(("model.layers.1.", "lm_head"))}
    assert len(_meta(cpu_off)) == len(list(cpu_off.model.parameters()))
    for handle in (disk, cpu_off):
        assert str(handle.device) == "cpu" and handle.dtype == torch.float32
        assert torch.equal(_logits(handle, ids), _logits(base, ids))
        assert handle.weights_sha256() == base.weights_sha256()
    info = disk.info()
    assert info["device"] == "cpu" and info["device_map"]["model.layers.1"] == "disk"
    assert "device_map" not in base.info()
    offloaded = disk.anatomy.attn_out(1)
    assert torch.equal(module_tensor(offloaded), base.anatomy.attn_out(1).weight)
    assert torch.equal(stored_tensor(disk.model, "lm_head.weight"), base.model.lm_head.weight)


@pytest.mark.parametrize(("family", "source"), [("llama", "memory"), ("llama", "directory"), ("gpt2", "directory")])
def test_max_memory_puts_what_does_not_fit_on_disk(tmp_path, ids, family, source):
    """A strategy under a memory limit; a directory loads straight into the map (from_pretrained), GPT-2's
    tied embedding and unembedding planned onto one device."""
    from mechkit.model.sources.tiny import byte_tokenizer

    spec = f"tiny:{family}"
    if source == "directory":
        model, _ = tiny_model(family)
        model.save_pretrained(tmp_path / "model", safe_serialization=True)
        byte_tokenizer().save_pretrained(tmp_path / "model")
        spec = str(tmp_path / "model")
    plain = mk.load_model(f"tiny:{family}", device="cpu")
    m = mk.load_model(spec, device_map="sequential", max_memory={"cpu": "400KB"}, offload_folder=tmp_path / "off")
    assert {"cpu", "disk"} == set(m.device_map.values())
    if family == "llama":
        assert m.device_map["model.layers.0"] == "cpu" and m.device_map["model.layers.1"] == "disk"
    else:
        assert m.device_map["transformer.wte"] == m.device_map["lm_head"]
    assert _meta(m) and torch.equal(_logits(m, ids), _logits(plain, ids))
    assert m.weights_sha256() == plain.weights_sha256()
    assert len(list((tmp_path / "off").iterdir())) == 1  # one fresh folder per model, never a shared one


def test_the_whole_model_on_disk(base, tmp_path, ids):
    m = mk.load_model("tiny:llama", device_map="disk", offload_folder=tmp_path)
    assert set(m.device_map.values()) == {"disk"} and len(_meta(m)) == len(list(m.model.parameters()))
    assert torch.equal(_logits(m, ids), _logits(base, ids))


def test_detect_head_scores_are_identical(base, dispatched):
    from mechkit.heads.scores import head_scores, repeated_tokens

    tokens = repeated_tokens(base, n_seqs=4, seg_len=6, seed=0)
    want, got = head_scores(base, tokens, 6), head_scores(dispatched, tokens, 6)
    for kind, scores in want.scores.items():
        assert (got.scores[kind] == scores).all(), kind
    assert (got.loss_per_position == want.loss_per_position).all()


def test_detect_and_inspect_read_offloaded_weights(base, dispatched, tmp_path, monkeypatch):
    """The OV copying scores and the model card read weights accelerate keeps off the model (``meta``)."""
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    options = dict(n_seqs=4, seg_len=6, batch_size=2)
    want = mk.run("detect", model=base, write=False, **options).results
    got = mk.run("detect", model=dispatched, write=False, **options).results
    assert got == want
    card = mk.run("inspect", model=dispatched, write=False).results
    assert card["anatomy"] == mk.run("inspect", model=base, write=False).results["anatomy"]


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_is_identical(base, dispatched, ids, mode):
    reference = torch.randint(0, 256, (4, 9), generator=torch.Generator().manual_seed(1))
    out = []
    for handle in (base, dispatched):
        with mk.ablate(handle, heads="0.1,1.2,1.3", mode=mode, reference=reference):
            out.append(_logits(handle, ids))
    assert torch.equal(out[0], out[1])
    assert not torch.equal(out[1], _logits(base, ids))


def _stored(handle) -> dict[str, torch.Tensor]:
    """Every offloaded tensor as its accelerate hook reads it, from the weights map (a copy)."""
    return {n: stored_tensor(handle.model, n).clone() for n in _meta(handle)}


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_shuffle_edits_offloaded_weights_and_restores_them_bit_exactly(tmp_path, family, ids):
    from mechkit.interventions import permutation, shuffle_heads

    plain = mk.load_model(f"tiny:{family}", device="cpu")
    device_map = LLAMA_DISK if family == "llama" else GPT2_DISK
    for handle in (mk.load_model(f"tiny:{family}", device_map=device_map, offload_folder=tmp_path),
                   _cpu_offloaded(family)):
        before, maps = _stored(handle), {id(h): h.weights_map for _, h in _offload_hooks(handle)}
        clean = _logits(handle, ids)
        heads = [Head(1, 0), Head(1, 2), Head(1, 3), Head(0, 1), Head(0, 2)]
        mapping = permutation(heads, seed=3)
        out = []
        for h in (plain, handle):
            with shuffle_heads(h, mapping, component="qkov"):
                out.append(_logits(h, ids))
        assert torch.equal(out[0], out[1]) and not torch.equal(out[1], clean)
        after = _stored(handle)
        assert before.keys() == after.keys() and before
        assert all(torch.equal(before[n], after[n]) for n in before)
        assert all(h.weights_map is maps[id(h)] for _, h in _offload_hooks(handle))  # the stored maps, untouched
        assert torch.equal(_logits(handle, ids), clean)
        assert handle.weights_sha256() == plain.weights_sha256()


def _offload_hooks(handle):
    from accelerate.hooks import AlignDevicesHook

    return [(n, m._hf_hook) for n, m in handle.model.named_modules()
            if isinstance(getattr(m, "_hf_hook", None), AlignDevicesHook) and m._hf_hook.offload]


def test_edits_of_offloaded_weights_are_undone_on_error(disk, ids):
    clean = _logits(disk, ids)
    before = _stored(disk)
    with pytest.raises(RuntimeError), mk.edit_weights(disk) as w:
        w.zero_head_output(Head(1, 1))
        w.param(disk.anatomy.mlp_out(1))[:] = 0
        assert not torch.equal(_logits(disk, ids), clean)
        raise RuntimeError("boom")
    assert all(torch.equal(before[n], stored_tensor(disk.model, n)) for n in before)
    assert torch.equal(_logits(disk, ids), clean)


def test_exact_sweep_partial_forwards_are_identical(base, dispatched):
    from mechkit.heads.effects import exact_effects

    prompts = mk.build_prompts("swap", n=4, shots=1, seed=0)
    want, got = exact_effects(base, prompts, batch_size=2), exact_effects(dispatched, prompts, batch_size=2)
    assert (got.logprob == want.logprob).all() and (got.accuracy == want.accuracy).all()
    assert got.clean_logprob == want.clean_logprob


def test_icl_vectors_residual_edits_are_identical(base, disk, tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    options = dict(tasks="swap", method="task-vector", n=3, n_dev=2, n_contexts=2, shots=2, layers="0,1",
                   batch_size=4)
    want = mk.run("icl-vectors", model=base, write=False, **options).results
    got = mk.run("icl-vectors", model=disk, write=False, **options).results
    assert got == want


def test_task_vectors_reach_offloaded_weights(base, dispatched, ids, tmp_path):
    from mechkit.taskarith import TaskVector, apply, save_merged

    gen = torch.Generator().manual_seed(5)
    deltas = {n: 0.05 * torch.randn(p.shape, generator=gen) for n, p in base.model.named_parameters()}
    tv = TaskVector(deltas)
    before = _stored(dispatched)
    out = []
    for handle in (base, dispatched):
        with apply(handle, tv, scale=0.5):
            out.append(_logits(handle, ids))
    assert torch.equal(out[0], out[1]) and not torch.equal(out[1], _logits(base, ids))
    assert all(torch.equal(before[n], stored_tensor(dispatched.model, n)) for n in before)
    assert torch.equal(_logits(dispatched, ids), _logits(base, ids))
    # written from the offloaded model: the edited weights, read back through the hooks
    merged = {}
    for name, handle in (("base", base), ("dispatched", dispatched)):
        path = save_merged(handle, tv, tmp_path / name, scale=0.5)
        merged[name] = _logits(mk.load_model(str(path), device="cpu"), ids)
    assert torch.equal(merged["base"], merged["dispatched"]) and torch.equal(merged["base"], out[0])


# ---- bad input: one line, exit 2, nothing written -----------------------------------------------------


def _one_line_cli(tmp_path, capsys, monkeypatch, *args, load=False):
    from mechkit.cli.main import main
    from mechkit.model import loading

    if not load:
        monkeypatch.setattr(loading, "_resolve", lambda *a, **k: pytest.fail("the model was loaded"))
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", "--model", "tiny:gpt2", "--out", str(out), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".run")]
    return err[0]


@pytest.mark.skipif(torch.cuda.device_count() > 3, reason="this machine has a cuda:3")
@pytest.mark.parametrize("args", [["--device-map", "transformer=cuda:3,lm_head=cpu"], ["--device-map", "cuda:3"],
                                  ["--max-memory", "cuda:3=1GiB,cpu=1GiB"]])
def test_a_device_map_naming_a_device_not_here_is_one_line(tmp_path, capsys, monkeypatch, args):
    line = _one_line_cli(tmp_path, capsys, monkeypatch, *args)
    assert "cuda:3" in line and ("built without CUDA" in line or "device(s) here" in line) and " — " in line
    with pytest.raises(MechkitError, match="cuda:3"):
        mk.load_model("tiny:gpt2", device_map={"transformer": "cuda:3", "lm_head": "cpu"})


def test_max_memory_too_small_is_one_line(tmp_path, capsys, monkeypatch):
    line = _one_line_cli(tmp_path, capsys, monkeypatch, "--max-memory", "cpu=100KB", load=True)
    assert "too small for the model" in line and "--offload-folder" in line
    with pytest.raises(DispatchError, match="too small"):
        mk.load_model("tiny:llama", device_map="auto", max_memory={"cpu": "100KB"})


def test_an_offload_folder_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = _one_line_cli(tmp_path, capsys, monkeypatch, "--offload-folder", str(blocker / "offload"))
    assert "--offload-folder" in line and "is a file" in line
    with pytest.raises(DispatchError, match="is a file, not a folder"):
        mk.load_model("tiny:llama", device_map="auto", offload_folder=blocker)
    if os.geteuid() != 0:  # root writes through mode bits
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(DispatchError, match="not writable"):
            mk.load_model("tiny:llama", device_map="auto", offload_folder=locked / "off")


@pytest.mark.parametrize(("kwargs", "words"), [
    (dict(device_map="everywhere"), "is not a strategy"),
    (dict(device_map="disk"), "no --offload-folder"),
    (dict(device_map={"model.layerz": "cpu"}), "does not have"),
    (dict(device_map={"model.embed_tokens": "cpu"}), "gives no device for"),
    (dict(device_map={"model": "cpu", "lm_head": "disk"}), "no --offload-folder"),
    (dict(max_memory={"cpu": "lots"}), "cannot read 'lots' as a size"),
    (dict(device="cpu", device_map="auto"), "both given"),
])
def test_bad_dispatch_arguments_are_one_line(kwargs, words):
    with pytest.raises(MechkitError, match=words) as info:
        mk.load_model("tiny:llama", **kwargs)
    assert "\n" not in str(info.value) and " — " in str(info.value)


# ---- a map across GPU and CPU (run where a GPU is lent) --------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: a map across GPU and CPU")

GPU_CPU = {"model.embed_tokens": "cuda:0", "model.rotary_emb": "cuda:0", "model.layers.0": "cuda:0",
           "model.layers.1": "cpu", "model.norm": "cuda:0", "lm_head": "cpu"}


@pytest.mark.gpu
@needs_cuda
def test_gpu_and_cpu_offloaded_map_matches_the_gpu_model(ids):
    """Layer 1 and the head CPU-offloaded (weights in CPU memory, run on the GPU), the rest on the GPU."""
    from mechkit.heads.effects import exact_effects
    from mechkit.interventions import permutation, shuffle_heads

    gpu = mk.load_model("tiny:llama", device="cuda", dtype="float32")
    split = mk.load_model("tiny:llama", device_map=GPU_CPU, dtype="float32")
    assert str(split.device) == "cuda:0" and _meta(split)
    assert split.weights_sha256() == gpu.weights_sha256()

    def close(a, b):
        return torch.allclose(a.float().cpu(), b.float().cpu(), atol=1e-5, rtol=1e-5)

    assert close(_logits(split, ids), _logits(gpu, ids))
    for mode in ("zero", "mean"):
        out = []
        for h in (gpu, split):
            with mk.ablate(h, heads="0.1,1.2", mode=mode, reference=ids):
                out.append(_logits(h, ids))
        assert close(*out)
    before = _stored(split)
    out = []
    for h in (gpu, split):
        with shuffle_heads(h, permutation([Head(1, 0), Head(1, 2), Head(0, 3)], seed=1), component="qkov"):
            out.append(_logits(h, ids))
    assert close(*out)
    assert all(torch.equal(before[n], stored_tensor(split.model, n)) for n in before)
    prompts = mk.build_prompts("swap", n=4, shots=1, seed=0)
    a, b = exact_effects(gpu, prompts, batch_size=2), exact_effects(split, prompts, batch_size=2)
    assert abs(a.logprob - b.logprob).max() < 1e-4


@pytest.mark.gpu
@needs_cuda
def test_auto_map_over_gpu_and_cpu_with_max_memory(ids):
    cpu = mk.load_model("tiny:llama", device="cpu")
    split = mk.load_model("tiny:llama", device_map="sequential", max_memory={"cuda:0": "300KB", "cpu": "1GiB"},
                          dtype="float32")
    assert {"cuda:0", "cpu"} <= set(split.device_map.values())
    assert torch.allclose(_logits(split, ids).cpu(), _logits(cpu, ids), atol=1e-5, rtol=1e-5)
