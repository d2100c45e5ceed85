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
    pruned = frozenset({"neurons", "heads", "uneven-heads", "layers"})  # anatomy and a forward: any shape
    options = (
        Option("batch", int, 4, "Batch size of the timed forward pass.", min=1, max=4096),
        Option("seq_len", int, 128, "Sequence length of the timed forward pass (at most the model's context).",
               min=1, max=1_048_576),
        Option("repeats", int, 5, "Timed repeats (the median is reported).", min=1, max=1000),
    )

    def run(self, ctx: RunContext) -> Result:
        from mechkit.eval.scoring import check_context
        from mechkit.heads.norms import head_out_norms
        from mechkit.model.backends.weight_reads import read_weights
        from mechkit.report import head_heatmap

        handle, opts = ctx.model, ctx.options
        check_context(handle, opts["seq_len"], "use a --seq-len within it")  # before any forward
        norms = read_weights(handle, head_out_norms)  # on a remote model: on its server, one job
        results = {
            "anatomy": handle.anatomy.as_dict(),
            "hook_points_per_layer": 7,
            "parameters": _param_counts(handle),
            "forward": _forward_timing(handle, opts["batch"], opts["seq_len"], opts["repeats"], ctx.seed),
            "head_output_norm": norms,
        }
        fig = head_heatmap(norms, "Per-head norm of the attention output projection", "‖W_O[:, head]‖")
        return Result(results=results, figures={"head_output_norm": fig}, finding=finding(results))

    @classmethod
    def tables(cls, results: dict) -> list:
        """The anatomy, the parameters by component, and the timed forward pass."""
        from mechkit.report import Table, kv_table

        params = results["parameters"]
        total = params["total"] or 1
        fwd = results["forward"]
        timing = {"batch × sequence": f"{fwd['batch']} × {fwd['seq_len']}", "repeats": fwd["repeats"],
                  "median (ms)": fwd["median_s"] * 1e3, "fastest (ms)": fwd["min_s"] * 1e3,
                  "tokens per second": round(fwd["tokens_per_s"])}
        return [kv_table("Anatomy", {**results["anatomy"], "hook points per layer": results["hook_points_per_layer"]}),
                Table("Parameters", ["component", "parameters", "share"],
                      [[k, v, v / total] for k, v in params.items()], note="share of the total"),
                kv_table("Forward pass", timing, digits=2)]


def finding(results: dict) -> str:
    """The model's shape, where its parameters sit, and how fast a plain forward pass is."""
    a, params, fwd = results["anatomy"], results["parameters"], results["forward"]
    total = params["total"] or 1
    kv = f" ({a['n_kv_heads']} KV)" if a.get("n_kv_heads") not in (None, a.get("n_heads")) else ""
    return (f"A {a.get('family', '?')}-family model of {a.get('n_layers')} layers × {a.get('n_heads')} heads{kv} "
            f"with {params['total']:,} parameters ({params['attention'] / total:.0%} attention, "
            f"{params['mlp'] / total:.0%} MLP); a forward pass over {fwd['batch']} × {fwd['seq_len']} tokens takes "
            f"{fwd['median_s'] * 1e3:.1f} ms ({fwd['tokens_per_s']:,.0f} tokens/s).")
