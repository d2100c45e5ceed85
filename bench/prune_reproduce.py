"""Reproduce a saved pruned model's figures the way a user would: no mechkit, only transformers,
safetensors and torch.

``bench/prune.py`` saves the pruned model it reports on (``model.safetensors``, ``config.json``,
tokenizer) and the held-out prompts it scored (``heldout.json``). This script rebuilds the pruned
model from the saved tensors' shapes alone — every linear layer takes the shape (and bias) found in
``model.safetensors``, each attention layer's query/KV head counts follow from its projections, the
layer count from the tensors present — loads the weights strictly, and then measures, against the
dense model (a plain HF directory):

- exact match by greedy decoding (``generate``, one prompt at a time, KV cache on): correct when the
  decoded text begins with the answer and its terminator, as the report defines it;
- forward time, plain ``time.perf_counter`` around ``model(...)`` on one padded batch of held-out
  prompts, dense and pruned interleaved, median of ``--repeats``: last-position logits
  (``logits_to_keep=1``, what answering a prompt or a generation's prefill computes) and all logits.

    python bench/prune_reproduce.py PRUNED_DIR --dense DENSE_DIR [--threads 1] [--repeats 9]
    python bench/prune_reproduce.py --quick     # prunes tiny:llama itself: a smoke test, not a measurement

Only Llama-style models (``nn.Linear`` projections, ``q/k/v/o_proj``) are rebuilt here; that is
what the bench saves. Prints a JSON summary (also written with ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path

os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch import nn  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402


def rebuild(directory: Path) -> nn.Module:
    """The saved model, built from its config and the shapes of its saved tensors (strict load)."""
    state = load_file(str(directory / "model.safetensors"))
    raw = json.loads((directory / "config.json").read_text())
    raw.pop("mechkit_pruning", None)  # what mechkit's own loader reads; not used here
    n_layers = len({m.group(1) for k in state if (m := re.match(r"model\.layers\.(\d+)\.", k))})
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    config.num_hidden_layers = n_layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:n_layers]
    model = AutoModelForCausalLM.from_config(config)
    for name, module in list(model.named_modules()):
        weight = state.get(f"{name}.weight")
        if isinstance(module, nn.Linear) and weight is not None and (
                tuple(weight.shape) != tuple(module.weight.shape) or f"{name}.bias" in state):
            parent, _, child = name.rpartition(".")
            new = nn.Linear(weight.shape[1], weight.shape[0], bias=f"{name}.bias" in state)
            setattr(model.get_submodule(parent), child, new)
    for layer in model.model.layers:  # head counts follow from the (sliced) projections
        attn, d = layer.self_attn, layer.self_attn.head_dim
        attn.num_key_value_groups = attn.q_proj.out_features // attn.k_proj.out_features
        assert attn.q_proj.out_features % d == 0 and attn.k_proj.out_features % d == 0
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"saved tensors do not fit the rebuilt model: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def greedy_correct(model: nn.Module, tok, prompt: dict) -> bool:
    """Greedy decoding of one prompt: does the text begin with the answer and its terminator?"""
    target = prompt["answer"] + prompt["terminator"]
    ids = tok(prompt["text"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(target) + 1,
                             do_sample=False, pad_token_id=tok.pad_token_id or 0)
    return tok.decode(out[0, ids.shape[1]:]).startswith(target)


def forward_times(models: list[nn.Module], tok, texts: list[str], repeats: int, last: bool) -> list[float]:
    """Median seconds of one forward of each model on the same padded batch, runs interleaved."""
    enc = tok(texts, return_tensors="pt", padding=True)
    extra = {"logits_to_keep": 1} if last else {}
    times: list[list[float]] = [[] for _ in models]
    with torch.no_grad():
        for rnd in range(repeats + 1):  # round 0 warms up
            for i, m in enumerate(models):
                start = time.perf_counter()
                m(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], use_cache=False, **extra)
                if rnd:
                    times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def quick_inputs(root: Path) -> tuple[Path, Path]:
    """``(pruned, dense)`` directories for ``--quick``: ``tiny:llama`` pruned by ``mechkit prune`` (the
    only place mechkit is used here), its held-out prompts, and the dense model as a plain HF directory."""
    import mechkit as mk
    from mechkit.model.sources.tiny import tiny_model

    run = mk.run("prune", model="tiny:llama", out=root / "run", tasks="capitalize", guide="magnitude",
                 sparsity="0.3", calib=2, n=2, shots=1, repeats=1, timing_batch=2, save_model=True)
    pruned = run.out_dir / "model"
    prompts = mk.build_prompts("capitalize", n=2, shots=1, seed=0)
    held = {"prompts": {"capitalize": [{"text": q.text, "answer": q.answer, "terminator": q.terminator}
                                       for q in prompts]}, "timing_texts": [q.text for q in prompts]}
    (pruned / "heldout.json").write_text(json.dumps(held))
    dense, _ = tiny_model("llama")
    dense.save_pretrained(root / "dense")
    return pruned, root / "dense"


def main() -> None:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pruned", type=Path, nargs="?")
    p.add_argument("--dense", type=Path, default=None, help="the dense model, a plain HF directory (required)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test, not a measurement: prune tiny:llama here and reproduce that (2 repeats)")
    p.add_argument("--prompts", type=Path, default=None, help="default: PRUNED/heldout.json")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--timing-batch", type=int, default=None, help="default: the bench's, from heldout.json")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.pruned, args.dense = quick_inputs(Path(tempfile.mkdtemp(prefix="prune-reproduce-quick-")))
        args.repeats = 2
    if args.pruned is None or args.dense is None:
        p.error("PRUNED and --dense are required (or --quick)")
    held = json.loads((args.prompts or args.pruned / "heldout.json").read_text())
    tok = AutoTokenizer.from_pretrained(args.pruned)
    dense = AutoModelForCausalLM.from_pretrained(args.dense, dtype=torch.float32).eval()
    pruned = rebuild(args.pruned)
    out: dict = {"pruned": str(args.pruned), "dense": str(args.dense), "threads": torch.get_num_threads(),
                 "params": {"dense": sum(p.numel() for p in dense.parameters()),
                            "pruned": sum(p.numel() for p in pruned.parameters())}}
    acc: dict = {"dense": {}, "pruned": {}}
    for task, prompts in held["prompts"].items():
        for name, model in (("dense", dense), ("pruned", pruned)):
            acc[name][task] = sum(greedy_correct(model, tok, q) for q in prompts) / len(prompts)
    mean = {k: sum(v.values()) / len(v) for k, v in acc.items()}
    out.update(greedy_accuracy=acc, mean_accuracy=mean, accuracy_ratio=mean["pruned"] / max(mean["dense"], 1e-9))
    texts = held["timing_texts"][:args.timing_batch] if args.timing_batch else held["timing_texts"]
    for last in (True, False):
        d, q = forward_times([dense, pruned], tok, texts, args.repeats, last)
        out[f"speedup_{'last' if last else 'all'}"] = d / q
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
