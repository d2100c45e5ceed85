"""``mechkit inspect``: the model's anatomy, parameter counts and a plain forward-pass timing."""

from __future__ import annotations

import statistics
import time

from mechkit.plugin import Option, Plugin, Result, RunContext


def _param_counts(handle) -> dict[str, int]:
    a = handle.anatomy
    attn = sum(p.numel() for layer in range(a.n_layers) for p in a.attn(layer).parameters())
    mlp = sum(p.numel() for layer in range(a.n_layers) for p in a.mlp(layer).parameters())
    total = sum(p.numel() for p in handle.model.parameters())
    return {"total": total, "attention": attn, "mlp": mlp, "other": total - attn - mlp}


def _head_out_norms(handle) -> list[list[float]]:
    """Frobenius norm of each head's block of the attention output projection."""
    import torch

    from mechkit.model.linear import weight_out_in

    a = handle.anatomy
    rows = []
    with torch.no_grad():
        for layer in range(a.n_layers):
            w = weight_out_in(a.attn_out(layer)).float()
            blocks = w.reshape(w.shape[0], a.n_heads, a.d_head)
            rows.append(blocks.pow(2).sum(dim=(0, 2)).sqrt().tolist())
    return rows


def _forward_timing(handle, batch: int, seq_len: int, repeats: int, seed: int) -> dict[str, float]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, handle.model.config.vocab_size, (batch, seq_len), generator=gen)
    times = []
    with torch.no_grad():
        handle(ids)  # warm-up
        for _ in range(repeats):
            if handle.device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            handle(ids)
            if handle.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
    median = statistics.median(times)
    return {"batch": batch, "seq_len": seq_len, "repeats": repeats, "median_s": median,
            "min_s": min(times), "tokens_per_s": batch * seq_len / median}


class InspectPlugin(Plugin):
    name = "inspect"
    version = "0.1.0"
    summary = "Report the model's anatomy, parameter counts and a plain forward-pass timing."
    options = (
        Option("batch", int, 4, "Batch size of the timed forward pass.", min=1),
        Option("seq_len", int, 128, "Sequence length of the timed forward pass.", min=1),
        Option("repeats", int, 5, "Timed repeats (the median is reported).", min=1),
    )

    def run(self, ctx: RunContext) -> Result:
        from mechkit.report import head_heatmap

        handle, p = ctx.model, ctx.params
        norms = _head_out_norms(handle)
        results = {
            "anatomy": handle.anatomy.as_dict(),
            "hook_points_per_layer": 7,
            "parameters": _param_counts(handle),
            "forward": _forward_timing(handle, p["batch"], p["seq_len"], p["repeats"], ctx.seed),
            "head_output_norm": norms,
        }
        fig = head_heatmap(norms, "Per-head norm of the attention output projection", "‖W_O[:, head]‖")
        return Result(results=results, figures={"head_output_norm": fig})
