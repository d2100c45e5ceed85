"""detect, ablate, shuffle and sweep: from Python and the CLI, with the report contract."""

from __future__ import annotations

import json

import pytest

import mechkit as mk
from tests.conftest import cli_in_process

TINY = dict(model="tiny:llama", write=False)


def test_detect_report(tmp_path):
    run = mk.run("detect", model="tiny:gpt2", out=tmp_path / "d", n_seqs=6, seg_len=6, top_k=3)
    res = run.results
    assert set(res["scores"]) == {"induction", "previous-token", "duplicate-token"}
    assert len(res["scores"]["induction"]) == 2 and len(res["scores"]["induction"][0]) == 4
    assert len(res["top"]["induction"]) == 3 and {"layer", "head", "score"} <= set(res["top"]["induction"][0])
    assert len(res["loss_per_position"]) == 11 and len(res["ov_copying"]) == 2
    for name in ("induction_scores.png", "previous-token_scores.png", "loss_per_position.png"):
        assert (run.out_dir / name).exists()


def test_ablate_conditions_contract(tmp_path):
    detect = mk.run("detect", model="tiny:llama", out=tmp_path / "d", n_seqs=6, seg_len=6)
    run = mk.run("ablate", model="tiny:llama", out=tmp_path / "a", tasks="swap,plus-one", n=3, shots=2,
                 sweep="1,2", baseline_seeds=2, from_report=str(detect.out_dir))
    conds = run.results["conditions"]
    assert [c["name"] for c in conds] == ["clean", "target", "random", "random", "target", "random", "random"]
    top2 = detect.results["top"]["induction"][:2]
    target2 = [c for c in conds if c["name"] == "target" and c["k"] == 2][0]
    assert {(h["layer"], h["head"]) for h in target2["heads"]} == {(h["layer"], h["head"]) for h in top2}
    for c in conds:
        assert set(c["metrics"]) == {"swap", "plus-one"}
        assert {"accuracy", "logprob"} <= set(c["metrics"]["swap"])
        if c["name"] == "random":
            assert not {(h["layer"], h["head"]) for h in c["heads"]} & {(h["layer"], h["head"]) for h in target2["heads"]
                                                                        if c["k"] == 2}
    assert (run.out_dir / "accuracy_vs_k.png").exists() and (run.out_dir / "accuracy_k1.png").exists()
    assert run.report["checks"]["logits_unchanged"]


@pytest.mark.parametrize("mode", ["mean", "resample"])
def test_ablate_modes(mode):
    run = mk.run("ablate", **TINY, heads="0.1,1.2", mode=mode, tasks="swap", n=3, shots=2, baseline_seeds=1)
    assert run.results["conditions"][1]["heads"] == [{"layer": 0, "head": 1}, {"layer": 1, "head": 2}]


def test_shuffle_and_sweep_reports():
    shuffled = mk.run("shuffle", **TINY, heads="0.0,0.1,1.2", component="qkov", tasks="swap", n=3, shots=2,
                      n_seqs=4, seg_len=5, seeds=2)
    names = [c["name"] for c in shuffled.results["conditions"]]
    assert names == ["clean", "target", "outside", "random", "target", "outside", "random"]
    assert all(len(c["mapping"]) == 3 for c in shuffled.results["conditions"][1:])
    targets = {"0.0", "0.1", "1.2"}
    for c in shuffled.results["conditions"][1:]:
        moved_to, moved_from = set(c["mapping"]), set(c["mapping"].values())
        if c["name"] == "target":
            assert moved_to == moved_from == targets
        elif c["name"] == "outside":
            assert moved_to == targets and not moved_from & targets
        else:
            assert moved_to == moved_from and not moved_to & targets
    swept = mk.run("sweep", **TINY, tasks="swap", n=4, shots=2, method="both")
    assert len(swept.results["exact"]["logprob_effect"]) == 2
    assert -1.0 <= swept.results["agreement"]["spearman"] <= 1.0


@pytest.mark.parametrize("args, needle", [
    (["ablate", "--heads", "17-3"], "malformed head spec"),
    (["ablate", "--heads", "5.0"], "out of range"),
    (["ablate", "--tasks", "capitalise"], "unknown task"),
    (["ablate", "--sweep", "five"], "--sweep 'five'"),
    (["shuffle", "--heads", "layer:9"], "out of range"),
    (["sweep", "--tasks", "nope"], "unknown task"),
    (["ablate", "--from", "/nonexistent/report.json"], "report"),
])
def test_bad_input_fails_cleanly(tmp_path, args, needle):
    out = tmp_path / "out"
    result = cli_in_process(*args, "--model", "tiny:llama", "--out", str(out))
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr.lower() and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("plugin, heads", [("ablate", "induction,17-3"), ("ablate", "induction,5.0"),
                                           ("shuffle", "previous-token,layer:9")])
def test_head_spec_is_checked_before_head_scores_are_computed(monkeypatch, plugin, heads):
    import mechkit.heads.scores as scores

    def never(*args, **kwargs):
        raise AssertionError("head scores were computed before the spec was checked")

    monkeypatch.setattr(scores, "compute_scores", never)
    with pytest.raises(mk.MechkitError, match="malformed head spec|out of range"):
        mk.run(plugin, **TINY, heads=heads, tasks="swap", n=2, shots=2)


@pytest.mark.slow
def test_detect_finds_smollm2_induction_heads(tmp_path):
    run = mk.run("detect", model="llama", out=tmp_path / "d", n_seqs=12, seg_len=25)
    top = [(h["layer"], h["head"]) for h in run.results["top"]["induction"][:4]]
    assert top[0] == (18, 6) and set(top) <= {(18, 6), (17, 3), (17, 4), (17, 5), (18, 7)}
    assert run.results["top"]["induction"][0]["score"] > 0.7
    assert run.results["loss_second_copy"] < 0.4 * run.results["loss_first_copy"]
    report = json.loads((run.out_dir / "report.json").read_text())
    assert report["model"]["n_kv_heads"] == 3 and report["schema"] == "mechkit.report/v1"


def test_composite_settings_reach_the_prompts():
    runs = {setting: mk.run("ablate", **TINY, heads="0.1", tasks="capitalize+swap,swap", n=2, shots=2,
                            baseline="none", setting=setting)
            for setting in ("composite", "composite-in-context")}
    for setting, run in runs.items():
        assert run.report["params"]["setting"] == setting
        assert set(run.results["conditions"][0]["metrics"]) == {"capitalize+swap", "swap"}
    from mechkit.eval.evaluation import task_prompts

    prompts = task_prompts(["capitalize+swap", "swap"], 2, 2, 0, "composite-in-context")
    assert all(p.setting == "composite-in-context" for p in prompts["capitalize+swap"])
    assert all(p.setting == "simple" for p in prompts["swap"])
