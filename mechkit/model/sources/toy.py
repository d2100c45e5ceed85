"""A toy model trained by mechkit itself, whose circuit is known: ground truth for the test suite.

Random-init models (:mod:`mechkit.model.sources.tiny`) have the right shapes but no behaviour, and the
embedded model's heads are only known empirically. Detection and ablation code needs a model where
the answer is known in advance, so this module trains one in seconds on a CPU:

- a 2-layer Llama (4 query heads sharing 2 KV heads, hidden 64, a token-sized MLP that HF Llama requires)
  over the byte tokenizer of :mod:`mechkit.model.sources.tiny` (259 ids);
- on ``[BOS] + seg + seg`` where ``seg`` is 10–25 random byte ids (distinct within a segment, the
  length drawn per batch so no fixed positional offset works). The first copy is unpredictable
  (loss ≈ ln 256); the second copy is predictable *only* by induction: find where the current token
  sat before and copy the token that followed it.

What it learns is the classic two-head circuit (Olsson et al., 2022): a **previous-token head in
layer 0** writes "the token before me" into each position, and an **induction head in layer 1**
matches the current token against that (K-composition) and copies the next one. On repeated random
tokens the second-copy loss falls to a few percent of the first copy's. Training is seeded (weights
and data), and :func:`toy_model` caches the result as safetensors under
``cache_root()/toy/induction-<recipe hash>`` so later calls load in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from mechkit.errors import MechkitError
from mechkit.io import atomic_dir
from mechkit.io.disk_cache import refuse_foreign_entry
from mechkit.model.sources.tiny import SPECIAL_TOKENS, VOCAB, byte_tokenizer

FORMAT = 1  # bump when the cache layout or the training code changes meaning
N_BYTES = 256  # data ids are bytes 0..255; BOS/EOS/PAD (256..258) never appear inside a sequence
BOS_ID = SPECIAL_TOKENS["bos_token_id"]

CONFIG: dict[str, Any] = dict(
    **SPECIAL_TOKENS, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
)
# Everything that shapes the weights besides the config, steps and seed (it enters the cache key).
TRAIN: dict[str, Any] = dict(
    batch=32, seg_len=(10, 25), lr=2e-3, warmup=50, decay_from=2 / 3, final_lr_frac=0.1,
    weight_decay=0.01, betas=(0.9, 0.98), grad_clip=1.0,
)
DEFAULT_STEPS = 1200


def _config():
    from transformers import LlamaConfig

    return LlamaConfig(**CONFIG)


def recipe_hash(seed: int = 0, steps: int = DEFAULT_STEPS) -> str:
    """12 hex digits over the config, training recipe, steps, seed and cache format."""
    recipe = {"config": CONFIG, "train": TRAIN, "steps": steps, "seed": seed, "format": FORMAT}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def cache_dir(seed: int = 0, steps: int | None = None) -> Path:
    """Where :func:`toy_model` keeps the weights for this recipe."""
    from mechkit.io.disk_cache import cache_root

    return cache_root() / "toy" / f"induction-{recipe_hash(seed, DEFAULT_STEPS if steps is None else steps)}"


def induction_batch(batch: int, seg_len: int, generator=None):
    """``[batch, 1 + 2·seg_len]`` ids: BOS, then a random segment of byte ids twice.

    Segments hold distinct bytes, so "the token after the earlier occurrence" is unique.
    """
    import torch

    seg = torch.rand(batch, N_BYTES, generator=generator).argsort(dim=1)[:, :seg_len]
    bos = torch.full((batch, 1), BOS_ID, dtype=torch.long)
    return torch.cat([bos, seg, seg], dim=1)


def _lr_factor(step: int, steps: int) -> float:
    """Linear warmup, constant through the phase change, then cosine down to ``final_lr_frac``."""
    t = TRAIN
    if step < t["warmup"]:
        return (step + 1) / t["warmup"]
    start = int(steps * t["decay_from"])
    if step < start:
        return 1.0
    done = (step - start) / max(1, steps - start)
    return t["final_lr_frac"] + (1 - t["final_lr_frac"]) * 0.5 * (1 + math.cos(math.pi * done))


def train_induction_model(seed: int = 0, steps: int = DEFAULT_STEPS, device: str = "cpu",
                          progress: bool = False, threads: int | None = 1):
    """Train the toy induction model from scratch; returns ``(model, tokenizer)``.

    About 20 s for the default 1200 steps on one CPU core. ``threads`` (CPU only, restored
    afterwards) defaults to 1: the matrices are 64 wide, so intra-op threads only add
    synchronisation — measured on a busy 2-core machine, 19 ms/step on one thread against
    67–2000 ms/step on two. ``None`` keeps torch's setting.
    Deterministic given ``seed`` on a given machine: ``torch.manual_seed`` (in a forked RNG state, so
    the caller's is untouched) fixes the initial weights and a separate ``torch.Generator`` draws
    the data. Returned in eval mode on ``device``.
    """
    import torch
    from transformers import LlamaForCausalLM

    t = TRAIN
    previous_threads = torch.get_num_threads()
    if threads is not None and str(device).startswith("cpu"):
        torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):  # seed the init without touching the caller's RNG
            torch.manual_seed(seed)
            model = LlamaForCausalLM(_config())
        model.to(device).train()
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=t["betas"],
                                weight_decay=t["weight_decay"])
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: _lr_factor(step, steps))
        low, high = t["seg_len"]
        with _progress(progress, steps) as advance, torch.enable_grad():  # trains also under torch.no_grad()
            for _ in range(steps):
                seg_len = int(torch.randint(low, high + 1, (1,), generator=gen))
                ids = induction_batch(t["batch"], seg_len, gen).to(device)
                logits = model(input_ids=ids, use_cache=False).logits
                loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                                                         ids[:, 1:].reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
                opt.step()
                sched.step()
                advance(loss)
    finally:
        torch.set_num_threads(previous_threads)
    model.eval()
    return model, byte_tokenizer()


@contextlib.contextmanager
def _progress(enabled: bool, steps: int):
    if not enabled:
        yield lambda loss: None  # no .item(): no device sync per step
        return
    from rich.console import Console
    from rich.progress import Progress

    from mechkit.io.progress import draws_live, plain_progress

    console = Console(stderr=True)
    with Progress(transient=True, console=console) if draws_live(console) else plain_progress(console) as bar:
        task = bar.add_task("training toy induction model", total=steps)

        def advance(loss) -> None:
            bar.update(task, advance=1, description=f"training toy induction model (loss {float(loss):.2f})")

        yield advance


def toy_model(seed: int = 0, steps: int | None = None):
    """The trained toy induction model and the byte tokenizer, from the cache or trained once.

    The first call trains (~20 s on one CPU core) and writes safetensors + ``config.json`` atomically;
    later calls with the same recipe load them in well under a second.
    """
    steps = DEFAULT_STEPS if steps is None else steps
    target = cache_dir(seed, steps)
    if not (target / "mechkit-toy.json").is_file():
        refuse_foreign_entry("toy", target)  # a user's folder of that name is never replaced by the training
        print(f"mechkit: training the toy induction model (first use only, ~20 s) into {target}",
              file=sys.stderr, flush=True)
        start = time.perf_counter()
        model, tok = train_induction_model(seed=seed, steps=steps)
        try:
            _save(model, target, seed, steps, train_s=time.perf_counter() - start)
        except OSError as err:  # a read-only or full cache: the trained model is still good for this run
            why = err.strerror or type(err).__name__
            print(f"mechkit: warning: cannot keep the toy model in {target} ({why}); it will be trained again "
                  "next time — point $MECHKIT_CACHE at a writable directory", file=sys.stderr, flush=True)
        return model, tok
    return _load(target), byte_tokenizer()


def _save(model, target: Path, seed: int, steps: int, train_s: float) -> None:
    meta = {"recipe": recipe_hash(seed, steps), "seed": seed, "steps": steps, "format": FORMAT,
            "config": CONFIG, "train": TRAIN, "train_s": round(train_s, 2)}

    def write(replace: bool) -> None:
        with atomic_dir(target, replace=replace) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)  # safetensors only, never pickle
            (tmp / "mechkit-toy.json").write_text(json.dumps(meta, indent=2))  # marks a whole entry

    try:
        write(replace=target.exists() or target.is_symlink())  # a stale partial entry is replaced
    except MechkitError:
        # another process finished the same recipe first: keep theirs when it is whole, else replace it
        if not (target / "mechkit-toy.json").is_file():
            write(replace=True)


def _load(target: Path):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target, local_files_only=True, use_safetensors=True)
    model.eval()
    return model
