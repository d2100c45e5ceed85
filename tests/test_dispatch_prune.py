"""Pruning, ``--save-model``, fine-tuning and task-vector extraction from a dispatched model.

A model accelerate dispatched keeps its offloaded weights off the model (parameters on ``meta``,
values in its hooks' weights maps). Every weight the pruning code reads (guides, compensation,
least-squares refits, parameter counts), the pruned copy, the saved model, the fine-tuning copy and
a task vector's base are read from there, so the numbers are those of the undispatched model —
bit-identical on this CPU (``torch.equal`` and ``==``), as in ``tests/test_dispatch.py`` — and the
dispatched model itself is left exactly as it was.
"""

from __future__ import annotations

import pytest
import torch

import mechkit as mk
from mechkit import pruning
from mechkit.errors import MechkitError
from mechkit.model.placement.copies import check_fits
from mechkit.model.placement.stored import is_dispatched, stored_tensor
from mechkit.model.sources.tiny import tiny_model
from mechkit.pruning.cost import n_params

# as in tests/test_dispatch.py: the second layer and the unembedding on disk, the rest in memory
LLAMA_DISK = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
              "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "disk"}
GPT2_DISK = {"transformer.wte": "disk", "lm_head": "disk", "transformer.wpe": "cpu", "transformer.drop": "cpu",
             "transformer.h.0": "cpu", "transformer.h.1": "disk", "transformer.ln_f": "cpu"}
MAPS = {"llama": LLAMA_DISK, "gpt2": GPT2_DISK}
TASKS = ["capitalize"]


def _cpu_offloaded(family: str):
    """Every weight on meta, kept in CPU memory by accelerate's hooks (``cpu_offload``)."""
    from accelerate import cpu_offload

    model, tok = tiny_model(family)
    cpu_offload(model, execution_device=torch.device("cpu"))
    return mk.load_model(model, tokenizer=tok)


def _ids():
    return torch.randint(0, 256, (3, 11), generator=torch.Generator().manual_seed(0))


def _logits(handle):
    with torch.no_grad():
        return handle(_ids())


def _snapshot(handle) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[str]]:
    """Logits, every tensor as stored (copies), and which parameters are on meta."""
    state = {n: stored_tensor(handle.model, n).clone() for n in handle.model.state_dict()}
    return _logits(handle), state, [n for n, p in handle.model.named_parameters() if p.device.type == "meta"]


def _same_snapshot(a, b) -> bool:
    return torch.equal(a[0], b[0]) and a[1].keys() == b[1].keys() and all(
        torch.equal(a[1][n], b[1][n]) for n in a[1]) and a[2] == b[2]


def _state_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].device.type != "meta" and torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Per family: the plain model, one with part of its layers on disk, one CPU-offloaded from meta."""
    out = {}
    for family in ("llama", "gpt2"):
        folder = tmp_path_factory.mktemp(f"offload-{family}")
        out[family] = {"base": mk.load_model(f"tiny:{family}", device="cpu"),
                       "disk": mk.load_model(f"tiny:{family}", device_map=MAPS[family], offload_folder=folder),
                       "cpu_off": _cpu_offloaded(family)}
    return out


@pytest.fixture(scope="module")
def studies(models):
    """A small prune study per model (calibration statistics, held-out prompts, 800 characters of
    held-out text for the perplexity)."""
    out = {}
    for family, kinds in models.items():
        for kind, handle in kinds.items():
            study = pruning.PruneStudy(handle, TASKS, n_calib=3, n=4, shots=2, repeats=1, timing_batch=2,
                                       text_weight=0.5, guide_text_weight=0.5)
            study.text = study.text[:800]
            out[(family, kind)] = study
    return out


def test_calibration_and_guide_scores_are_identical(models, studies):
    """Statistics and every guide that reads weights or takes gradients (attribution, gradient)."""
    for kind in ("disk", "cpu_off"):
        want, got = studies[("llama", "base")], studies[("llama", kind)]
        for field in ("mlp_mean", "mlp_sq", "head_mean", "head_sq", "block_influence"):
            assert torch.equal(getattr(got.calib.stats, field), getattr(want.calib.stats, field)), field
        for guide in ("magnitude", "wanda", "flap", "gradient", "attribution"):
            a, b = want.scores(guide), got.scores(guide)
            assert (a.mlp == b.mlp).all() and (a.heads == b.heads).all() and (a.layers == b.layers).all(), guide


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_pruned_copies_equal_those_of_the_undispatched_model(models, studies, family, tmp_path):
    """Guides × reconstructions × targets: the same plan, the same pruned weights, the same accuracy,
    perplexity, parameters and FLOPs; the saved model holds the same tensors; the dispatched model is
    unchanged (logits, stored weights, where its parameters live)."""
    cases = [("magnitude", {"neurons": 0.3}, "none"), ("wanda", {"neurons": 0.3, "heads": 0.25}, "mean"),
             ("attribution", {"neurons": 0.3, "heads": 0.25}, "lsq")]
    if family == "llama":
        cases.append(("magnitude", {"neurons": 0.2, "layers": 0.5}, "lsq"))
    base = studies[(family, "base")]
    for kind in ("disk", "cpu_off"):
        handle = models[family][kind]
        study = studies[(family, kind)]
        before = _snapshot(handle)
        for guide, level, method in cases:
            plans = [s.plan(guide, level, method) for s in (base, study)]
            assert plans[0].as_dict() == plans[1].as_dict()
            want, got = base.prune(plans[0], method), study.prune(plans[1], method)
            assert not is_dispatched(got.model)
            assert _state_equal(got.model, want.model), (kind, guide, method)
            assert study.measure(got, plans[1]) == base.measure(want, plans[0])
            if method == "lsq":
                saved = [pruning.save_pruned(h, tmp_path / f"{kind}-{guide}-{who}")
                         for who, h in (("base", want), ("dispatched", got))]
                reloaded = [mk.load_model(str(d)) for d in saved]
                assert _state_equal(reloaded[0].model, reloaded[1].model)
                assert torch.equal(_logits(reloaded[1]), _logits(want))
        assert _same_snapshot(_snapshot(handle), before)
        assert handle.weights_sha256() == models[family]["base"].weights_sha256()
    assert {n_params(models[family][k]) for k in ("base", "disk", "cpu_off")} == {n_params(models[family]["base"])}


def test_prune_plugin_with_save_model_from_a_disk_offloaded_model(models, studies, tmp_path):
    """``mechkit prune --save-model`` end to end on the disk-offloaded model: the row and the saved tensors
    are those of the same study on the undispatched model (the fixture's, with the plugin's defaults)."""
    from safetensors.torch import load_file

    run = mk.run("prune", model=models["llama"]["disk"], out=tmp_path / "run", tasks="capitalize", guide="wanda",
                 sparsity="0.3", reconstruct="lsq", calib=3, n=4, shots=2, repeats=1, timing_batch=2,
                 save_model=True)
    row = run.results["rows"][0]
    base = studies[("llama", "base")]
    plan = base.plan("wanda", {"neurons": 0.3}, "lsq")
    assert row["plan"] == plan.as_dict()
    want = base.measure(base.prune(plan, "lsq"), plan)
    assert {k: row[k] for k in ("accuracy", "params", "flops_per_token")} == \
        {k: want[k] for k in ("accuracy", "params", "flops_per_token")}
    pruning.save_pruned(base.prune(plan, "lsq"), tmp_path / "want")
    saved, expected = (load_file(str(d / "model.safetensors")) for d in (tmp_path / "run" / "model", tmp_path / "want"))
    assert saved.keys() == expected.keys() and all(torch.equal(saved[n], expected[n]) for n in expected)
    assert run.results["dense"]["params"] == n_params(models["llama"]["base"])
    # the dense model is timed as a plain copy on the main device, as the pruned copy runs: the speedup
    # is the pruning's, not the pruning's plus the offload the copy avoids
    assert run.results["dense"]["timed_as"].startswith("a plain copy")


def test_finetune_from_a_dispatched_model_trains_the_same_copy(models, tmp_path):
    from mechkit.taskarith.finetune import Recipe, finetune

    recipe = Recipe(task="capitalize", steps=3, batch_size=4, lr=1e-3)
    want = finetune(models["llama"]["base"], recipe)
    for kind in ("disk", "cpu_off"):
        handle = models["llama"][kind]
        before = _snapshot(handle)
        got = finetune(handle, recipe)
        assert got.losses == want.losses
        assert not is_dispatched(got.model) and _state_equal(got.model, want.model)
        assert _same_snapshot(_snapshot(handle), before)
    lora = Recipe(task="capitalize", steps=2, batch_size=4, lr=1e-3, method="lora", rank=2)
    a, b = finetune(models["gpt2"]["base"], lora), finetune(models["gpt2"]["disk"], lora)
    assert a.losses == b.losses and _state_equal(a.model, b.model)


def test_finetune_plugin_and_task_vector_from_a_dispatched_model(models, tmp_path):
    """``mechkit finetune`` then ``taskvec extract`` with the dispatched model as ``--model``."""
    from safetensors.torch import load_file

    from mechkit.taskarith import extract

    options = dict(task="capitalize", steps=2, batch_size=4, eval_n=4, checkpoint_every=0)
    runs = {kind: mk.run("finetune", model=models["llama"][kind], out=tmp_path / kind, **options)
            for kind in ("base", "disk")}
    assert runs["disk"].results["losses"] == runs["base"].results["losses"]
    assert runs["disk"].results["accuracy_after"] == runs["base"].results["accuracy_after"]
    saved = {k: load_file(str(tmp_path / k / "model.safetensors")) for k in runs}
    assert all(torch.equal(saved["disk"][n], saved["base"][n]) for n in saved["base"])
    want = extract(models["llama"]["base"], tmp_path / "base")
    for kind in ("disk", "cpu_off"):
        got = extract(models["llama"][kind], tmp_path / "base")
        assert got.deltas.keys() == want.deltas.keys()
        assert all(torch.equal(got.deltas[n], want.deltas[n]) for n in want.deltas)


def test_task_vector_of_a_tied_model_from_its_offloaded_base(models, tmp_path):
    """GPT-2 ties its unembedding to the embedding: one delta, under the embedding's name, as undispatched."""
    from mechkit.taskarith import extract
    from tests.conftest import noisy_model_dir

    ft = noisy_model_dir(tmp_path / "ft", family="gpt2", seed=1)
    want = extract(models["gpt2"]["base"], ft)
    assert "lm_head.weight" not in want.deltas
    for kind in ("disk", "cpu_off"):
        got = extract(models["gpt2"][kind], ft)
        assert got.deltas.keys() == want.deltas.keys()
        assert all(torch.equal(got.deltas[n], want.deltas[n]) for n in want.deltas)
    # the command line: `mechkit taskvec extract --device-map ... --offload-folder ...` writes the same vector
    from click.testing import CliRunner

    from mechkit.cli.main import cli
    from mechkit.taskarith import TaskVector

    pairs = ",".join(f"{module}={device}" for module, device in GPT2_DISK.items())
    out = tmp_path / "tv.safetensors"
    result = CliRunner().invoke(cli, ["taskvec", "extract", "--base", "tiny:gpt2", "--finetuned", str(ft), "--out",
                                      str(out), "--device-map", pairs, "--offload-folder", str(tmp_path / "off")])
    assert result.exit_code == 0, result.output
    got = TaskVector.load(out)
    assert got.deltas.keys() == want.deltas.keys()
    assert all(torch.equal(got.deltas[n], want.deltas[n]) for n in want.deltas)


def test_a_copy_that_cannot_fit_is_one_line():
    with pytest.raises(MechkitError) as err:
        check_fits(2 ** 60, "cpu", "fine-tuning (full) the dispatched model tiny", "fine-tune with --method lora")
    assert "fine-tuning (full) the dispatched model tiny needs" in str(err.value)
    assert "\n" not in str(err.value) and err.value.fix == "fine-tune with --method lora"


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: a map across GPU and CPU")
# as in tests/test_dispatch.py: layer 1 and the head CPU-offloaded (run on the GPU), the rest on the GPU
GPU_CPU = {"model.embed_tokens": "cuda:0", "model.rotary_emb": "cuda:0", "model.layers.0": "cuda:0",
           "model.layers.1": "cpu", "model.norm": "cuda:0", "lm_head": "cpu"}


@pytest.mark.gpu
@needs_cuda
def test_pruning_and_finetuning_a_gpu_and_cpu_map_build_their_copies_on_the_gpu():
    """The copies go to the main device; weights sliced from the same stored weights are equal, what
    GPU kernels compute is close (1e-5) to the model held on the GPU."""
    from mechkit.taskarith.finetune import Recipe, finetune

    gpu = mk.load_model("tiny:llama", device="cuda", dtype="float32")
    split = mk.load_model("tiny:llama", device_map=GPU_CPU, dtype="float32")
    plan = pruning.UnitsToRemove(mlp={0: list(range(40)), 1: list(range(20, 60))}, heads={1: [0, 2]})
    want, got = pruning.prune_copy(gpu, plan), pruning.prune_copy(split, plan)
    assert not is_dispatched(got.model) and {p.device.type for p in got.model.parameters()} == {"cuda"}
    assert _state_equal(got.model.cpu(), want.model.cpu())
    recipe = Recipe(task="capitalize", steps=2, batch_size=4, lr=1e-3)
    a, b = finetune(gpu, recipe), finetune(split, recipe)
    assert {p.device.type for p in b.model.parameters()} == {"cuda"}
    assert max(abs(x - y) for x, y in zip(a.losses, b.losses, strict=True)) < 1e-4


def test_the_dense_model_pruned_copies_are_timed_against_is_a_plain_copy(models):
    """A pruned copy runs in memory; the dense reference it is timed against must too (not streamed)."""
    from mechkit.pruning.cost import timing_reference

    ref, note = timing_reference(models["llama"]["disk"])
    assert not is_dispatched(ref.model) and note.startswith("a plain copy")
    assert ref.weights_sha256() == models["llama"]["base"].weights_sha256()
    assert torch.equal(_logits(ref), _logits(models["llama"]["base"]))
    assert timing_reference(models["llama"]["base"]) == (models["llama"]["base"], "as loaded")
