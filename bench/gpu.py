"""GPU readiness: detect, ablate and an exact head sweep on a random model of a real size, in plain-forward units.

The model is built from a config only (random weights, bf16 on CUDA, float32 on CPU): the default
``llama3-8b`` shape is Llama-3-8B's (32 layers, 32 query / 8 KV heads, d_model 4096, MLP 14336,
vocabulary 128256). Weights are random, so accuracies mean nothing here; what is measured is cost:

- ``plain``: median time of one HF forward on the batch (full logits), and its tokens/s;
- ``detect``: :func:`mechkit.heads.head_scores` on repeated random tokens (one pass, patterns reduced
  in hooks), tokens/s and the ratio to the plain forward's throughput;
- ``ablate``: scoring the task prompts with the top-k heads zero-ablated (:func:`mechkit.ablate`),
  against scoring them clean;
- ``sweep``: :func:`mechkit.heads.exact_effects` over ``--sweep-layers`` layers (every head of each,
  replaying only the blocks from that layer up), in plain-forward equivalents per head.

- ``nnsight`` (a peer, when installed; ``--no-peers`` skips it): the same detect stripe scores read
  from each layer's attention weights inside a trace, and one forward with the same top-k heads
  zero-ablated (zeros written into ``o_proj``'s input), beside mechkit's ablated forward; the
  agreement of scores and logits is printed with the times.

Peak CUDA memory (``torch.cuda.max_memory_allocated``) is recorded for each, with the weights'
own size for reference. On CPU the script runs (``--shape tiny`` or ``1b``) as a smoke test; the
figures worth quoting come from a GPU.

    python bench/gpu.py [--shape llama3-8b|1b|tiny] [--quick] [--n 16] [--shots 4] [--sweep-layers 2] [--no-peers]
"""

from __future__ import annotations

import common

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
}


def build(shape: str, device: str):
    """A random-initialised Llama of ``shape`` on ``device`` (bf16 on CUDA), with mechkit's byte tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import mechkit as mk
    from mechkit.model.sources.tiny import byte_tokenizer

    config = LlamaConfig(max_position_embeddings=8192, tie_word_embeddings=False, **SHAPES[shape])
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    return mk.load_model(model, tokenizer=byte_tokenizer(), device=device, dtype=dtype)


def measure(fn, device: str, repeats: int) -> dict:
    """Median seconds of ``fn`` and, on CUDA, its peak allocated memory (GiB)."""
    import torch

    cuda = device.startswith("cuda")

    def synced():
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        return out

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    stats = common.median_time(synced, repeats)
    if cuda:
        stats["peak_cuda_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return stats


def _nnsight_rows(handle, tokens, seg_len, heads, batch, base, clean, device, repeats, out, prompt_tokens,
                  detect_tokens) -> list[tuple]:
    """The same work through nnsight (a peer): detect's stripe scores read from each layer's attention
    weights inside a trace (bench/detect.py's method), and one forward with the same heads zero-ablated
    by writing zeros into ``o_proj``'s input, against mechkit's ablated forward. Agreement is printed
    beside the times (same inputs, same heads). Run last: nnsight's detect needs eager attention."""
    import detect as detect_bench
    import torch

    import mechkit as mk

    try:
        from nnsight import NNsight
    except ImportError:
        print("nnsight is not installed here: no peer rows")
        return []
    a = handle.anatomy
    ids, mask = batch.ids.to(handle.device), batch.mask.to(handle.device)

    def ours_ablated():
        with torch.no_grad(), mk.ablate(handle, heads, mode="zero"):
            return handle.model(input_ids=ids, attention_mask=mask).logits

    by_layer: dict[int, list[int]] = {}
    for h in heads:
        by_layer.setdefault(h.layer, []).append(h.head)
    wrapped = NNsight(handle.model)

    def theirs_ablated():
        with torch.no_grad(), wrapped.trace(input_ids=ids, attention_mask=mask):
            for layer, hs in sorted(by_layer.items()):  # nnsight asks for modules in the order they run
                x = wrapped.model.layers[layer].self_attn.o_proj.input
                for h in hs:
                    x[..., h * a.d_head:(h + 1) * a.d_head] = 0
            logits = wrapped.output.logits.save()
        return logits

    ours = measure(ours_ablated, device, repeats)
    theirs = measure(theirs_ablated, device, repeats)
    diff = (ours_ablated().float() - theirs_ablated().float()).abs().max().item()
    mech_scores = head_scores_for(handle, tokens, seg_len)
    nn_run = detect_bench._method("nnsight", handle, tokens, seg_len, len(tokens))  # switches to eager attention
    det = measure(nn_run, device, repeats)
    nn_scores = nn_run()[0]
    det_diff = max(float(abs(mech_scores[k] - torch.as_tensor(nn_scores[k])).max()) for k in nn_scores)
    out["nnsight"] = {"ablated_forward": theirs, "mechkit_ablated_forward": ours, "detect": det,
                      "ablated_logits_max_abs_diff": diff, "detect_scores_max_abs_diff": det_diff}
    print(f"nnsight agreement: ablated logits max |diff| {diff:.3g}; detect scores max |diff| {det_diff:.3g}")
    return [("nnsight: detect stripe scores in a trace", f"{detect_tokens / det['median_s']:.0f}",
             f"{det['median_s'] / base['median_s']:.2f}", f"{det.get('peak_cuda_gib', 0):.2f}"),
            (f"mechkit: forward, top-{len(heads)} heads zero-ablated", f"{prompt_tokens / ours['median_s']:.0f}",
             f"{ours['median_s'] / clean['median_s']:.2f}", f"{ours.get('peak_cuda_gib', 0):.2f}"),
            (f"nnsight: forward, top-{len(heads)} heads zero-ablated", f"{prompt_tokens / theirs['median_s']:.0f}",
             f"{theirs['median_s'] / clean['median_s']:.2f}", f"{theirs.get('peak_cuda_gib', 0):.2f}")]


def head_scores_for(handle, tokens, seg_len) -> dict:
    """mechkit's stripe scores on the detect batch, as CPU tensors (compared with nnsight's)."""
    import torch

    from mechkit.heads import head_scores

    scores = head_scores(handle, tokens, seg_len, batch_size=len(tokens)).scores
    return {k: torch.as_tensor(v).float().cpu() for k, v in scores.items()}


def main() -> None:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default=None, help="default llama3-8b on CUDA, tiny on CPU")
    p.add_argument("--task", default="capitalize")
    p.add_argument("--n", type=int, default=None, help="task prompts (default 16; quick 4)")
    p.add_argument("--shots", type=int, default=None, help="demonstrations per prompt (default 4; quick 1)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--n-seqs", type=int, default=16, help="repeated-token sequences for detect")
    p.add_argument("--seg-len", type=int, default=64)
    p.add_argument("--top-k", type=int, default=10, help="heads ablated")
    p.add_argument("--sweep-layers", type=int, default=2, help="layers of the exact sweep (each: every head)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs (default 5; quick 2)")
    p.add_argument("--no-peers", action="store_true", help="skip the nnsight rows (run last: they switch to eager attention)")
    args = p.parse_args()

    common.go_offline()
    threads = common.set_threads(args.threads)
    import torch

    import mechkit as mk
    from mechkit.eval.scoring import batches as make_batches
    from mechkit.heads import exact_effects, head_scores, repeated_tokens, top_heads

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = args.shape or ("llama3-8b" if device == "cuda" else "tiny")
    n, shots = args.n or (4 if args.quick else 16), args.shots or (1 if args.quick else 4)
    repeats = args.repeats or (2 if args.quick else 5)
    seg_len = 8 if args.quick else args.seg_len
    n_seqs = 4 if args.quick else args.n_seqs

    handle = build(shape, device)
    a = handle.anatomy
    weights_gib = sum(t.numel() * t.element_size() for t in handle.model.parameters()) / 2**30
    prompts = mk.build_prompts(args.task, n=n, shots=shots, seed=0)
    batch = make_batches(handle, prompts, args.batch_size)[0]
    prompt_tokens = int(batch.mask.sum())
    tokens = repeated_tokens(handle, n_seqs=n_seqs, seg_len=seg_len, seed=0)
    detect_tokens = tokens.numel()

    def plain(ids, mask=None):
        with torch.no_grad():
            return handle.model(input_ids=ids.to(handle.device),
                                attention_mask=None if mask is None else mask.to(handle.device)).logits

    rows, out = [], {"shape": shape, "device": device, "dtype": str(handle.dtype), "weights_gib": weights_gib,
                     "n_layers": a.n_layers, "n_heads": a.n_heads}
    base = measure(lambda: plain(tokens), device, repeats)
    out["plain_detect_batch"] = base
    det = measure(lambda: head_scores(handle, tokens, seg_len, batch_size=len(tokens)), device, repeats)
    out["detect"] = det
    rows.append(("plain forward (detect batch)", f"{detect_tokens / base['median_s']:.0f}", "1.00",
                 f"{base.get('peak_cuda_gib', 0):.2f}"))
    rows.append(("detect (head_scores)", f"{detect_tokens / det['median_s']:.0f}",
                 f"{det['median_s'] / base['median_s']:.2f}", f"{det.get('peak_cuda_gib', 0):.2f}"))

    scores = head_scores(handle, tokens, seg_len, batch_size=len(tokens)).scores["induction"]
    heads = top_heads(scores, min(args.top_k, a.n_layers * a.n_heads))
    clean = measure(lambda: plain(batch.ids, batch.mask), device, repeats)
    out["plain_prompt_batch"] = clean
    scored = measure(lambda: mk.score_prompts(handle, prompts, batch_size=args.batch_size), device, repeats)

    def ablated():
        with mk.ablate(handle, heads, mode="zero"):
            return mk.score_prompts(handle, prompts, batch_size=args.batch_size)

    abl = measure(ablated, device, repeats)
    out["score_clean"], out["score_ablated"] = scored, abl
    for label, m in (("plain forward (prompt batch)", clean), ("score prompts (clean)", scored),
                     (f"score prompts, top-{len(heads)} heads ablated", abl)):
        rows.append((label, f"{prompt_tokens / m['median_s']:.0f}", f"{m['median_s'] / clean['median_s']:.2f}",
                     f"{m.get('peak_cuda_gib', 0):.2f}"))

    layers = min(args.sweep_layers, a.n_layers)
    sweep_prompts = list(prompts)[: args.batch_size]

    def sweep():  # the first ``layers`` layers only: theirs are the costliest replays (every block above)
        from mechkit.heads import effects

        real = effects._layer_effects
        def limited(clean_run, layer, *rest):
            if layer >= layers:
                return {"logprob": [0.0] * a.n_heads, "accuracy": [0.0] * a.n_heads}
            return real(clean_run, layer, *rest)

        effects._layer_effects = limited
        try:
            return exact_effects(handle, sweep_prompts, batch_size=args.batch_size)
        finally:
            effects._layer_effects = real

    sw = measure(sweep, device, 1)
    per_head = sw["median_s"] / (layers * a.n_heads)
    out["sweep"] = {**sw, "layers": layers, "seconds_per_head": per_head,
                    "plain_forwards_per_head": per_head / clean["median_s"]}
    rows.append((f"exact sweep, layers 0–{layers - 1} ({layers * a.n_heads} heads)",
                 f"{prompt_tokens * layers * a.n_heads / sw['median_s']:.0f}",
                 f"{per_head / clean['median_s']:.2f} per head", f"{sw.get('peak_cuda_gib', 0):.2f}"))

    if not args.no_peers:
        rows += _nnsight_rows(handle, tokens, seg_len, heads, batch, base, clean, device, repeats, out,
                              prompt_tokens, detect_tokens)

    print(f"{shape} on {device} ({out['dtype']}, weights {weights_gib:.2f} GiB, {threads} CPU threads)")
    print(common.table(rows, ("what", "tokens/s", "time ÷ plain forward", "peak CUDA GiB")))
    out["environment"] = common.environment(threads)
    print("wrote", common.write_json("gpu", out, args.out))


if __name__ == "__main__":
    main()
