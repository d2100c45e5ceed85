"""Rebuild the figures of the analysis pages (docs/analyses/): one real run per plugin on the embedded model.

Why a script: a figure in the docs must come from a documented command, never from a hand-made plot.
For every analysis this runs the plugin through the real CLI with modest, written-down options (each
run a few minutes on a 2-core CPU), copies the run's headline figure (the first PNG the report lists,
the one ``report.html`` shows first) to ``docs/img/analyses/<name>.png`` and writes
``docs/img/analyses/<name>.json`` with the finding sentence and the exact commands, so the pages quote
the run instead of retyping it.

    python tools/docs_figures.py                 # every analysis, cheapest first
    python tools/docs_figures.py detect ablate   # only these
    python tools/docs_figures.py --list          # the commands, without running them

Runs go to ``mechkit-runs/docs/<name>`` (ignored by git). A run that exceeds ``--max-minutes`` is
stopped and its figure left as it was; the script says so and goes on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img" / "analyses"
RUNS = Path("mechkit-runs") / "docs"  # relative to ROOT, so the recorded commands are short


@dataclass(frozen=True)
class Analysis:
    """One page's figure: the commands that prepare its inputs, then the run whose headline it shows."""

    name: str
    command: str  # a `mechkit ...` line; its report's headline becomes the figure
    prepare: tuple[str, ...] = field(default=())  # commands whose outputs `command` reads


def _out(name: str) -> str:
    return str(RUNS / name)


FT = _out("finetune")  # past-tense, also task vector A of taskvec
FT_LOW = _out("finetune-lowercase")
TV_PAST, TV_LOW = _out("tv-past-tense.safetensors"), _out("tv-lowercase.safetensors")
FINETUNE_ARGS = "--steps 120 --lr 5e-5"

# Cheapest first: a slow machine still gets the quick pages' figures early.
ANALYSES: tuple[Analysis, ...] = (
    Analysis("inspect", f"mechkit inspect --model llama --out {_out('inspect')}"),
    Analysis("detect", f"mechkit detect --model llama --out {_out('detect')}"),
    Analysis("shuffle", "mechkit shuffle --model llama --heads induction --top-k 5 --component qk "
                        f"--seeds 2 --n 10 --from {_out('detect')} --out {_out('shuffle')}",
             prepare=(f"mechkit detect --model llama --out {_out('detect')}",)),
    Analysis("ablate", "mechkit ablate --model llama --heads induction --tasks capitalize,past-tense,country-capital "
                       f"--n 20 --sweep 5,10 --baseline-seeds 3 --from {_out('detect')} --out {_out('ablate')}",
             prepare=(f"mechkit detect --model llama --out {_out('detect')}",)),
    Analysis("compose", "mechkit compose --model llama --pairs capitalize+swap,capitalize+plus-one --parts study "
                        f"--n 5 --seeds 2 --out {_out('compose')}"),
    Analysis("sweep", f"mechkit sweep --model llama --tasks capitalize --n 8 --method both --out {_out('sweep')}"),
    Analysis("finetune", f"mechkit finetune --model llama --task past-tense {FINETUNE_ARGS} --out {FT}"),
    Analysis("icl-vectors", "mechkit icl-vectors --model llama --tasks past-tense --method both --n 20 --n-dev 10 "
                            f"--n-contexts 12 --n-cie 5 --layers 8-24 --out {_out('icl-vectors')}"),
    Analysis("taskvec", f"mechkit taskvec-sweep --model llama --vectors {TV_PAST},{TV_LOW} "
                        f"--lambdas=-1,-0.5,0,0.5,1,1.5,2 --shots 0,5 --out {_out('taskvec')}",
             prepare=(f"mechkit finetune --model llama --task past-tense {FINETUNE_ARGS} --out {FT}",
                      f"mechkit finetune --model llama --task lowercase {FINETUNE_ARGS} --out {FT_LOW}",
                      f"mechkit taskvec extract --base llama --finetuned {FT} --out {TV_PAST}",
                      f"mechkit taskvec extract --base llama --finetuned {FT_LOW} --out {TV_LOW}")),
    Analysis("prune", "mechkit prune --model llama --tasks capitalize,past-tense,country-capital "
                      "--guide attribution,random --target neurons --sparsity 0.45 --calib 8 --n 10 "
                      f"--repeats 3 --timing-batch 4 --out {_out('prune')}"),
    Analysis("adapt", "mechkit adapt --model llama --tasks past-tense,country-capital --budgets 0.6,0.8,1.0 "
                      "--token-layers 12 --token-keep 0.5 --margin 0.05 --calib 4 --n 5 --repeats 1 "
                      f"--prune-budgets 0.7 --out {_out('adapt')}"),
)


def _argv(command: str) -> list[str]:
    """`mechkit ...` as this interpreter runs it, so the script uses the checkout it sits in."""
    words = shlex.split(command)
    assert words[0] == "mechkit", command
    return [sys.executable, "-m", "mechkit.cli.main", *words[1:]]


def _done(command: str) -> bool:
    """A preparing command whose output is already there is not run again (finetunes take minutes)."""
    words = shlex.split(command)
    out = ROOT / words[words.index("--out") + 1]
    return (out / "report.json").exists() or (out.suffix == ".safetensors" and out.exists())


def _run(command: str, limit_s: float) -> float | None:
    """Run one command from the repository root; its wall time, or None when it failed or ran over."""
    argv = [*_argv(command), "--force"]  # every command here writes to --out; a rerun replaces it
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    print(f"$ {command}", flush=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env, timeout=limit_s)
    except subprocess.TimeoutExpired:
        print(f"  stopped after {limit_s / 60:.0f} min: figure left as it was", flush=True)
        return None
    took = time.monotonic() - start
    print(f"  exit {proc.returncode} after {took:.0f} s", flush=True)
    return took if proc.returncode == 0 else None


def _headline(out_dir: Path) -> tuple[dict, Path]:
    report = json.loads((out_dir / "report.json").read_text())
    pngs = [a for a in report.get("artifacts", []) if a.endswith(".png")]
    if not pngs:
        raise SystemExit(f"{out_dir}: the report has no figure")
    return report, out_dir / pngs[0]


def _machine() -> str:
    return f"{platform.machine()} CPU, {os.cpu_count()} cores shared with other jobs, {platform.system()}"


def build(analysis: Analysis, limit_s: float) -> bool:
    """Run one analysis and refresh its figure and JSON; False when a command failed or ran over."""
    for command in analysis.prepare:
        if not _done(command) and _run(command, limit_s) is None:
            return False
    took = _run(analysis.command, limit_s)
    if took is None:
        return False
    words = shlex.split(analysis.command)
    report, png = _headline(ROOT / words[words.index("--out") + 1])
    IMG.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, IMG / f"{analysis.name}.png")
    record = {
        "analysis": analysis.name,
        "plugin": report.get("plugin"),
        "command": analysis.command,
        "prepare": list(analysis.prepare),
        "finding": report.get("finding"),
        "figure": f"{analysis.name}.png",
        "figure_in_run": png.name,
        "wall_s": round(took),
        "date": dt.date.today().isoformat(),
        "machine": _machine(),
        "mechkit_version": report.get("mechkit_version") or report.get("version"),
    }
    (IMG / f"{analysis.name}.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(f"  -> docs/img/analyses/{analysis.name}.png: {record['finding']}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="analyses to rebuild (default: all, cheapest first)")
    parser.add_argument("--max-minutes", type=float, default=15, help="stop a command after this long")
    parser.add_argument("--list", action="store_true", help="print the commands and exit")
    args = parser.parse_args(argv)
    known = {a.name: a for a in ANALYSES}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown analyses {unknown}; choose from {', '.join(known)}")
    chosen = [a for a in ANALYSES if not args.names or a.name in args.names]
    if args.list:
        for a in chosen:
            print("\n".join([*a.prepare, a.command]))
        return 0
    failed = [a.name for a in chosen if not build(a, args.max_minutes * 60)]
    if failed:
        print(f"no new figure for: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
