"""Measured architecture coverage: every causal-LM type of the installed transformers, built tiny and
checked on each mechkit primitive.

    python -m tools.arch_coverage            # measure, print, write docs/architectures.json
    python -m tools.arch_coverage llama opt  # measure a few types, print only

A type is ``works`` (every check passed), ``unsupported`` (a one-line reason: not a decoder-only
transformer, or attention mechkit cannot split into heads), ``gap`` (a decoder-only transformer mechkit
does not handle yet, listed in :data:`KNOWN_GAPS` with what is missing), ``failing`` (a check fails: a
bug to fix) or ``not-buildable`` (no tiny model could be built from its config class).
The suite (tests/test_architectures.py) fails on any ``failing`` type and on any type that was
``works`` in the committed matrix and no longer is.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATRIX = ROOT / "docs" / "architectures.json"

_ENCODER = "encoder (bidirectional, BERT-style): its causal-LM head is a decoder-mode variant, not a decoder-only LM"
_SEQ2SEQ = "seq2seq decoder: the decoder half of an encoder-decoder model (cross-attention needs the encoder)"
_SSM = "not attention-based: a state-space / recurrent model has no attention heads"
_HYBRID = "hybrid: state-space or linear-attention layers between attention layers; mechkit's anatomy needs heads in every layer"
# Types that are not decoder-only transformer LMs, with why (checked by hand against each modeling file).
UNSUPPORTED: dict[str, str] = {
    **dict.fromkeys(("bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie",
                     "megatron-bert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer",
                     "xlm", "xlm-roberta", "xlm-roberta-xl", "xmod"), _ENCODER),
    **dict.fromkeys(("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp",
                     "pegasus", "plbart", "prophetnet", "trocr", "whisper", "musicgen", "musicgen_melody"), _SEQ2SEQ),
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm"), _SSM),
    **dict.fromkeys(("bamba", "jamba", "zamba", "zamba2", "falcon_h1", "granitemoehybrid", "nemotron_h",
                     "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "kimi_linear",
                     "olmo_hybrid", "bailing_hybrid", "lfm2", "lfm2_moe", "recurrent_gemma", "minimax", "lfm3",
                     "qwen4_exp", "qwen4_exp_text", "lara_mini"), _HYBRID),
    "reformer": "not a standard transformer: LSH / chunked local attention with reversible layers",
    "xlnet": "permutation language model with two-stream relative attention, not a causal decoder",
    "diffllama": "differential attention: a head's output is the difference of two softmax patterns, not one pattern",
    "hrm_text": "hierarchical recurrent model: two stacks (L and H modules) run in loops, not one stack of layers",
    "dory": "looped (recurrent-depth) model: its layers run several times per forward, so a hook point has several "
            "activations per token",
    "jetmoe": "mixture of attention heads (MoA): heads are routed experts, with no fixed per-head output projection",
    "cpmant": "attention with a segment-relative position bias computed outside the attention function",
}
_MLA = ("gap: multi-head latent attention (keys and values from a shared low-rank latent, kv_b_proj): "
        "the anatomy has no rows for it yet")
# Decoder-only transformers mechkit does not handle yet: measured like every type (a gap that starts
# working shows as a stale matrix), reported as "gap" with what is missing, instead of failing the suite.
KNOWN_GAPS: dict[str, str] = {
    **dict.fromkeys(("deepseek_v2", "deepseek_v3", "glm4_moe_lite", "hy_v4", "axk1", "minicpm3", "youtu",
                     "sarvam_mla", "longcat_flash", "deepseek_v32", "glm_moe_dsa", "axk2"), _MLA),
    "deepseek_v4": "gap: compressed attention (q_a/q_b, a single kv_proj, a grouped two-stage output projection) "
                   "and hyper-connections: the anatomy has no rows for it yet",
    **dict.fromkeys(("inkling2_text", "inkling2_loop_text"),
                    "gap: gated output projection (Inkling2GatedOutputProjection) with no single weight: no row yet"),
}
CHECKS = ("logits", "record", "ablate", "weights", "detect", "nnsight")


def model_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}"


def measure(model_type: str, costly: bool = True) -> dict:
    """One row of the matrix: ``{"status", "reason", "checks": {check: "ok" | error line}, "seconds"}``."""
    start = time.perf_counter()
    if model_type in UNSUPPORTED:
        return {"status": "unsupported", "reason": UNSUPPORTED[model_type]}
    from tools.arch_build import build
    from tools.arch_checks import reference_logits, run_checks

    try:
        model, _config = build(model_type)
        ref = reference_logits(model)
    except Exception as err:  # noqa: BLE001 - any failure to build and run it is the finding
        return {"status": "not-buildable", "reason": _line(err)}
    if model_type in KNOWN_GAPS and KNOWN_GAPS[model_type].startswith("unsupported:"):
        return {"status": "unsupported", "reason": KNOWN_GAPS[model_type].removeprefix("unsupported: ")}
    checks, note = run_checks(model, ref, costly=costly)
    row = {"status": "works", "reason": note or "", "checks": checks}
    if any(v != "ok" for v in checks.values()):
        bad = next(k for k, v in checks.items() if v != "ok")
        row.update(status="gap" if model_type in KNOWN_GAPS else "failing", reason=f"{bad}: {checks[bad]}")
        if model_type in KNOWN_GAPS:
            row["reason"] = f"{KNOWN_GAPS[model_type].removeprefix('gap: ')} ({row['reason']})"
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def measure_all(types: list[str] | None = None, costly: bool = True, echo: bool = False) -> dict:
    import transformers

    rows = {}
    for t in types or model_types():
        rows[t] = measure(t, costly=costly)
        if echo:
            print(f"{t:28s} {rows[t]['status']:14s} {rows[t].get('seconds', '')} {rows[t].get('reason', '')}",
                  flush=True)
    return {"transformers": transformers.__version__, "types": rows}


def counts(matrix: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in matrix["types"].values():
        out[row["status"]] = out.get(row["status"], 0) + 1
    return out


def main(argv: list[str]) -> None:
    warnings.filterwarnings("ignore")
    from mechkit.io.quiet import quiet

    with quiet():
        matrix = measure_all(argv or None, echo=True)
    print(counts(matrix))
    if not argv:
        MATRIX.write_text(json.dumps(matrix, indent=1, sort_keys=True) + "\n")
        print(f"wrote {MATRIX.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
