"""GGUF files: dequantized once by transformers' GGUF support, then cached as safetensors.

Dequantizing a GGUF file and converting its tokenizer takes 20 s for a 135M model and minutes for
bigger ones, so :func:`cached_gguf` does it once per file *content* and keeps the result under
``cache_root()/gguf/<stem>-<sha256[:16]>/`` (float32 ``model.safetensors``, ``config.json``, the
tokenizer files and ``mechkit-cache.json``); later loads are plain local ``from_pretrained`` calls,
and the dtype a caller asks for is applied then. The directory is written atomically; an entry whose
metadata is unreadable, of another format, or whose files are missing or hold other bytes than were written
(each file's sha256 is recorded, and checked through the same memo as the source's: a cached
``model.safetensors`` edited at its size was loaded as the user's GGUF), or that holds a file it did not write
(an added ``special_tokens_map.json`` or ``generation_config.json`` changed the tokenizer and generation), is
rebuilt. The entry's own records (``mechkit-cache.json`` and the memo) are trusted: whoever can rewrite the
cache's files can rewrite those too, so an edit that also forges them is not seen.

Hashing a multi-GB file on every load would cost seconds, so the sha256 is memoised in
``cache_root()/gguf/.hashes/`` keyed by the resolved path, size, mtime_ns, ctime_ns and inode: the
ctime cannot be set from user space, so a rewrite that restores the old mtime (``cp -p``,
``touch -d``) still changes the key, and a file replaced by rename changes the inode. A file changed
in the last 2 s is not memoised (timestamps are coarse), so a download still being written is hashed
again next time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from mechkit.errors import MechkitError, ModelLoadError, first_line
from mechkit.io import atomic_dir, write_atomic
from mechkit.io.disk_cache import cache_root, is_entry, refuse_foreign_entry

CACHE_FORMAT = 3  # bump when the entry layout or the conversion changes meaning
META = "mechkit-cache.json"
REQUIRED = ("model.safetensors", "config.json")
KEY_HEX = 16  # hex digits of the sha256 in an entry's name (64 bits)
# A file changed less than this long ago is hashed but not memoised: file timestamps come from a coarse
# clock, so a same-size rewrite within one tick could leave the stat key unchanged ("racy git").
RACY_NS = 2_000_000_000


def load_gguf(path: Path, torch_dtype=None):
    """A GGUF file, dequantized by transformers' GGUF reader (no cache: see :func:`cached_gguf`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch_dtype)
    except Exception as err:
        raise ModelLoadError(f"could not read GGUF file {path}: {first_line(err)}",
                             "the file may be corrupt or truncated — download it again") from err
    return model, tok


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _stat_key(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "inode": st.st_ino}


def gguf_sha256(path: Path) -> str:
    """The content hash of a GGUF file (or of a file of its cache entry), memoised by (resolved path, size,
    mtime_ns, ctime_ns, inode)."""
    path = Path(path).resolve()
    key = _stat_key(path)
    memo = cache_root() / "gguf" / ".hashes" / f"{hashlib.sha256(str(path).encode()).hexdigest()[:16]}.json"
    try:
        known = json.loads(memo.read_text(encoding="utf-8"))
        if isinstance(known, dict) and {k: known.get(k) for k in key} == key \
                and re.fullmatch(r"[0-9a-f]{64}", str(known.get("sha256"))):
            return known["sha256"]
    except (OSError, ValueError, RecursionError):
        pass  # no memo yet, or an unreadable one: hash again
    sha = file_sha256(path)
    settled = time.time_ns() - max(key["mtime_ns"], key["ctime_ns"]) > RACY_NS
    if settled and _stat_key(path) == key:  # unchanged while read, and not rewritable within one tick
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(memo, json.dumps({**key, "sha256": sha}))
        except OSError:
            pass  # a read-only cache still works, it just hashes every time
    return sha


def _slug(stem: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._-")[:64] or "model"


def entry_dir(path: Path, sha: str) -> Path:
    """Where the conversion of this content lives: an existing entry with the same hash (one holding
    ``mechkit-cache.json``), whoever named it, else ``gguf/<stem>-<sha256[:16]>``. A user's folder of a
    matching name that sorts first is passed over, not refused as "in the way" of the entry beside it."""
    group = cache_root() / "gguf"
    same = sorted(group.glob(f"*-{sha[:KEY_HEX]}")) if group.is_dir() else []
    same = [p for p in same if not p.name.startswith(".")]
    own = group / f"{_slug(Path(path).stem)}-{sha[:KEY_HEX]}"
    whole = [p for p in same if (p / META).is_file()]
    ours = [p for p in same if is_entry("gguf", p)]  # a damaged entry of mechkit's: rebuilt where it is
    return (whole or ours or [own])[0]


def read_entry(target: Path, sha: str) -> dict | None:
    """The entry's metadata when it is complete and for this content, else None (to be rebuilt)."""
    try:
        meta = json.loads((target / META).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != CACHE_FORMAT or meta.get("sha256") != sha:
        return None
    files = meta.get("files")
    if not isinstance(files, dict) or not all(name in files for name in REQUIRED):
        return None
    try:  # nothing beside what was written: from_pretrained reads any tokenizer or generation file it finds
        if {p.name for p in target.iterdir()} != {*files, META}:
            return None
    except OSError:
        return None
    for name, want in files.items():
        if not isinstance(want, dict) or not isinstance(name, str) or "/" in name or name.startswith("."):
            return None
        try:
            if (target / name).stat().st_size != want.get("size") or gguf_sha256(target / name) != want.get("sha256"):
                return None  # damaged, or edited since it was written: not the conversion of this GGUF
        except OSError:
            return None
    return meta


def cached_gguf(path: Path, *, label: str | None = None, rebuild: bool = False) -> tuple[Path, bool]:
    """The cache directory holding ``path`` dequantized, and whether this call built it.

    Built on first use of this content (and again when the entry is damaged, or ``rebuild``);
    ``label`` names the model in the one stderr line the first use prints.
    """
    path = Path(path)
    if path.exists() and not path.is_file():  # a FIFO or a device: named as such, not "not found"
        raise ModelLoadError(f"{path} is not a regular file (a directory, a FIFO or a device), so not a GGUF file",
                             "pass the .gguf file itself")
    if not path.is_file():
        raise ModelLoadError(f"GGUF file not found: {path}", "check the path")
    sha = gguf_sha256(path)
    target = entry_dir(path, sha)
    if not rebuild and read_entry(target, sha) is not None:
        return target, False
    _check_writable(target.parent)  # before the minutes of dequantizing, not at the last rename
    refuse_foreign_entry("gguf", target)  # a damaged entry is rebuilt, a user's folder of that name never replaced
    what = label or path.name
    size_mb = path.stat().st_size / 1e6
    if target.exists():
        print(f"mechkit: the cache entry {target} is incomplete or damaged (or changed since it was "
              f"written): dequantizing {what} again",
              file=sys.stderr, flush=True)
    else:
        print(f"mechkit: dequantizing {what} ({size_mb:.0f} MB; first use only, later loads read the cache) "
              f"into {target}", file=sys.stderr, flush=True)
    _build(path, sha, target)
    return target, True


def _check_writable(group: Path) -> None:
    """One line where the cache cannot take a new entry (a read-only or unwritable $MECHKIT_CACHE), probed by
    making and removing a hidden directory there."""
    try:
        group.mkdir(parents=True, exist_ok=True)
        probe = group / f".mechkit-probe-{os.urandom(4).hex()}"
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        raise MechkitError(f"cannot write mechkit's cache {group}: {err.strerror or type(err).__name__}; a GGUF "
                           "file is converted there once", "point $MECHKIT_CACHE at a writable directory") from None


def _build(path: Path, sha: str, target: Path) -> None:
    import torch
    from safetensors.torch import save_model

    start = time.perf_counter()
    model, tok = load_gguf(path, torch.float32)  # dequantized values are float32: stored losslessly

    def write(tmp: Path) -> None:
        # save_pretrained refuses GGUF-quantized models, but the weights are already dense:
        # write them directly (shared tensors deduplicated) with the config beside them.
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        model.config.quantization_config = None
        model.config.save_pretrained(tmp)
        # safetensors writes 0600; give the weights the umask-honouring mode config.json got
        os.chmod(tmp / "model.safetensors", (tmp / "config.json").stat().st_mode & 0o777)
        tok.save_pretrained(tmp)
        _strip_quantization(tmp / "config.json")
        files = {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in sorted(tmp.iterdir())
                 if p.is_file()}
        meta = {"format": CACHE_FORMAT, "name": path.stem, "source": str(path.resolve()),
                "size": path.stat().st_size, "sha256": sha, "dtype": "float32",
                "converted_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "convert_s": round(time.perf_counter() - start, 2), "files": files}
        write_atomic(tmp / META, json.dumps(meta, indent=2))  # last: only a whole entry has it

    try:
        with atomic_dir(target, replace=target.exists()) as tmp:
            write(tmp)
    except MechkitError:
        # another process created the entry meanwhile: keep theirs when it is whole, else replace it
        if read_entry(target, sha) is not None:
            return
        with atomic_dir(target, replace=True) as tmp:
            write(tmp)


def _strip_quantization(config_path: Path) -> None:
    cfg = json.loads(config_path.read_text())
    cfg.pop("quantization_config", None)
    config_path.write_text(json.dumps(cfg, indent=2))
