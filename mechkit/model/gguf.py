"""Reading GGUF files: dequantized by transformers' GGUF support (the ``gguf`` package)."""

from __future__ import annotations

from pathlib import Path

from mechkit.errors import ModelLoadError, first_line


def load_gguf(path: Path, torch_dtype=None):
    """A GGUF file, dequantized by transformers' GGUF reader."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch_dtype)
    except Exception as err:
        raise ModelLoadError(f"could not read GGUF file {path}: {first_line(err)}",
                             "the file may be corrupt or truncated — download it again") from err
    return model, tok
