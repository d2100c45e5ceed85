"""Rebuild the figures of the analysis pages (docs/analyses/): one real run per plugin on the embedded model.

Why a script: a figure in the docs must come from a documented command, never from a hand-made plot.
For every analysis this runs the plugin through the real CLI with modest, written-down options (each
run a few minutes on a 2-core CPU), copies the run's headline figure (the first PNG the report lists,
the one ``report.html`` shows first) to ``docs/img/analyses/<name>.png`` and writes
``docs/img/analyses/<name>.json`` with the finding sentence and the exact commands, so the pages quote
the run instead of retyping it.

    python tools/docs_figures.py                 # every analysis but adapt (78 min), cheapest first
    python tools/docs_figures.py adapt           # the adapt run behind docs/img/analyses/adapt-frontier.png
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
    figure: str = ""  # the file name under docs/img/analyses/ (default: the analysis name)
    long: bool = False  # over an hour: run only when named, never by a plain `docs_figures.py`


def _out(name: str) -> str:
    return str(RUNS / name)


FT = _out("finetune")  # past-tense, also task vector A of taskvec
FT_LOW = _out("finetune-lowercase")
TV_PAST, TV_LOW = _out("tv-past-tense.safetensors"), _out("tv-lowercase.safetensors")
FINETUNE_ARGS = "--steps 120 --lr 5e-5"
DETECT = f"mechkit detect --model llama --out {_out('detect')}"
FINETUNE_PAST = f"mechkit finetune --model llama --task past-tense {FINETUNE_ARGS} --out {FT}"

# Cheapest and most used first: a slow machine still gets those pages' figures early.
ANALYSES: tuple[Analysis, ...] = (
    Analysis("inspect", f"mechkit inspect --model llama --out {_out('inspect')}"),
    Analysis("detect", DETECT),
    Analysis("ablate", "mechkit ablate --model llama --heads induction --tasks past-tense,country-capital "
                       f"--n 10 --sweep 5,10 --baseline-seeds 2 --from {_out('detect')} --out {_out('ablate')}",
             prepare=(DETECT,)),
    Analysis("shuffle", "mechkit shuffle --model llama --heads induction --top-k 5 --component qk --seeds 2 "
                        f"--tasks past-tense --n 10 --n-seqs 20 --from {_out('detect')} --out {_out('shuffle')}",
             prepare=(DETECT,)),
    Analysis("sweep", f"mechkit sweep --model llama --tasks capitalize --n 6 --shots 5 --method both --out {_out('sweep')}"),
    Analysis("finetune", FINETUNE_PAST),
    Analysis("select-tasks", "mechkit select-tasks --model llama --target past-tense,country-capital,negation "
                             f"--out {_out('select-tasks')}"),
    Analysis("taskvec", f"mechkit taskvec-sweep --model llama --vectors {TV_PAST},{TV_LOW} "
                        f"--lambdas=-1,-0.5,0,0.5,1,1.5,2 --shots 0,5 --out {_out('taskvec')}",
             prepare=(FINETUNE_PAST,
                      f"mechkit finetune --model llama --task lowercase {FINETUNE_ARGS} --out {FT_LOW}",
                      f"mechkit taskvec extract --base llama --finetuned {FT} --out {TV_PAST}",
                      f"mechkit taskvec extract --base llama --finetuned {FT_LOW} --out {TV_LOW}")),
    Analysis("compose", "mechkit compose --model llama --pairs capitalize+swap,capitalize+plus-one --parts study "
                        f"--n 5 --seeds 2 --out {_out('compose')}"),
    Analysis("icl-vectors", "mechkit icl-vectors --model llama --tasks past-tense --method both --n 20 --n-dev 10 "
                            f"--n-contexts 12 --n-cie 5 --layers 10-22 --fv-scales 2,4 --out {_out('icl-vectors')}"),
    Analysis("prune", "mechkit prune --model llama --tasks capitalize,past-tense,country-capital "
                      "--guide attribution,random --target neurons --sparsity 0.45 --calib 8 --n 10 "
                      f"--repeats 3 --timing-batch 4 --out {_out('prune')}"),
    # The adapt page shows the frontier of the recorded 78-minute run (one thread, a quiet machine); this
    # is that command. Its timings mean something only on a machine with nothing else running.
    Analysis("adapt", "mechkit adapt --model llama --tasks capitalize,past-tense,country-capital "
                      "--budgets 0.5,0.6,0.7,0.8,0.9,1.0 --guide ablation --adherence 0.995 --margin-prompts 8 "
                      f"--margin-plans 10 --n 20 --out {_out('adapt')}", figure="adapt-frontier", long=True),
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


def _run(command: str, limit_s: float, threads: int) -> float | None:
    """Run one command from the repository root; its wall time, or None when it failed or ran over."""
    argv = [*_argv(command), "--force"]  # every command here writes to --out; a rerun replaces it
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
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


def _machine(threads: int) -> str:
    return (f"{platform.machine()} CPU, {os.cpu_count()} cores shared with other jobs, {platform.system()}, "
            f"OMP_NUM_THREADS={threads}")


def build(analysis: Analysis, limit_s: float, threads: int, keep: bool) -> bool:
    """Run one analysis and refresh its figure and JSON; False when a command failed or ran over.

    With ``keep`` a run whose report is already there is not repeated: only its figure is copied again.
    """
    for command in analysis.prepare:
        if not _done(command) and _run(command, limit_s, threads) is None:
            return False
    if keep and _done(analysis.command):
        took = None
    else:
        took = _run(analysis.command, limit_s, threads)
        if took is None:
            return False
    words = shlex.split(analysis.command)
    report, png = _headline(ROOT / words[words.index("--out") + 1])
    IMG.mkdir(parents=True, exist_ok=True)
    name = analysis.figure or analysis.name
    shutil.copyfile(png, IMG / f"{name}.png")
    record = {
        "analysis": analysis.name,
        "plugin": report.get("plugin"),
        "command": analysis.command,
        "prepare": list(analysis.prepare),
        "finding": report.get("finding"),
        "figure": f"{name}.png",
        "figure_in_run": png.name,
        "wall_s": None if took is None else round(took),
        "date": dt.date.today().isoformat(),
        "machine": _machine(threads),
        "mechkit_version": report.get("mechkit_version") or report.get("version"),
    }
    old = IMG / f"{analysis.name}.json"
    if took is None and old.exists():  # --keep: the run is the one recorded before
        record.update({k: json.loads(old.read_text()).get(k) for k in ("wall_s", "date", "machine")})
    (IMG / f"{analysis.name}.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(f"  -> docs/img/analyses/{name}.png: {record['finding']}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="analyses to rebuild (default: all but the long ones, cheapest first)")
    parser.add_argument("--max-minutes", type=float, default=12, help="stop a command after this long")
    parser.add_argument("--list", action="store_true", help="print the commands and exit")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run (1: kind to a shared machine)")
    parser.add_argument("--keep", action="store_true", help="reuse runs whose report is already there; only copy figures")
    args = parser.parse_args(argv)
    known = {a.name: a for a in ANALYSES}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown analyses {unknown}; choose from {', '.join(known)}")
    chosen = [known[n] for n in args.names] or [a for a in ANALYSES if not a.long]  # in the order named
    if args.list:
        for a in chosen:
            print("\n".join([*a.prepare, a.command]))
        return 0
    failed = [a.name for a in chosen if not build(a, args.max_minutes * 60, args.threads, args.keep)]
    if failed:
        print(f"no new figure for: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
