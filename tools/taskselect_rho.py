"""Spearman ρ of an existing select-tasks report's transfer gains under other representations.

Why a script: the single-candidate fine-tunes of ``select-tasks --validate --transfer-seeds 1`` take
hours on a CPU; the features of a new representation take minutes. This reads the gains from the
report, recomputes the features with the run's own settings (:mod:`mechkit.taskselect.rho`) and
prints ρ(gain, similarity) and ρ(gain, log coverage alone) per target and evaluation setting.

    python tools/taskselect_rho.py runs/tr-past-tense --representation lora-grad
    python tools/taskselect_rho.py runs/tr-past-tense/report.json --representation hidden,lora-grad \\
        --model llama --json rho.json

``--model`` defaults to the model the report names; give the same model (a different one gives
different features and a warning line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path


def parse(argv: list[str] | None) -> argparse.Namespace:
    from mechkit.taskselect.representations import REPRESENTATIONS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="a select-tasks run directory or its report.json")
    ap.add_argument("--representation", default="lora-grad",
                    help=f"comma-separated, from {', '.join(REPRESENTATIONS)} (default lora-grad)")
    ap.add_argument("--model", default=None, help="model spec (default: the report's)")
    ap.add_argument("--grad-blocks", type=int, default=None, help="lora-grad's last K blocks (default: the run's, or 0: all)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    args.representation = [r.strip() for r in args.representation.split(",") if r.strip()]
    bad = [r for r in args.representation if r not in REPRESENTATIONS]
    if bad or not args.representation:
        ap.error(f"--representation {','.join(bad) or '(none)'}: use {', '.join(REPRESENTATIONS)}")
    return args


def run(args: argparse.Namespace) -> dict:
    import mechkit as mk
    from mechkit.taskselect.rho import load_report, report_rho

    report = load_report(args.report)
    spec = args.model or report["model"]["spec"]
    handle = mk.load_model(spec)
    if handle.weights_sha256() != report["model"].get("weights_sha256"):
        print(f"taskselect_rho: warning: {spec} is not the report's model ({report['model']['spec']}): "
              "its ρ will differ", file=sys.stderr)
    out: dict[str, dict] = {}
    for rep in args.representation:
        for target, rows in report_rho(handle, report, rep, args.grad_blocks).items():
            out.setdefault(target, {}).update(rows)
    return out


def show(out: dict) -> None:
    print(f"{'target':<18} {'representation | eval':<24} {'ρ(gain, similarity)':>20} {'ρ(gain, log coverage)':>22}")
    for target, rows in out.items():
        for key, v in rows.items():
            print(f"{target:<18} {key:<24} {_num(v['similarity']):>20} {_num(v['coverage']):>22}")


def _num(x) -> str:
    return "—" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    from mechkit.errors import MechkitError

    args = parse(argv)
    try:
        check_json_target(args.json, args.report)
        out = run(args)
        show(out)
        if args.json is not None:
            write_json(Path(args.json), out)
    except MechkitError as err:
        print(f"taskselect_rho: {err}", file=sys.stderr)
        return 2
    return 0


def check_json_target(target: str | None, report: str) -> None:
    """Refuse, before minutes of features, a ``--json`` that would replace the run's own files (its
    report.json among them: the tool's input, lost) or that cannot be written (a missing folder, a folder)."""
    from mechkit.errors import MechkitError

    if target is None:
        return
    if not target.strip():  # "" was taken for "not given": the run ended 0 with no file and no word
        raise MechkitError(f"--json {target!r} names no file", "name one, e.g. --json rho.json, or leave --json out")
    if target.endswith("/"):  # resolve() drops the slash: the figures went to a file of the folder's name
        raise MechkitError(f"--json {target} ends with /, which names a folder", "name a file, e.g. --json rho.json")
    from mechkit.io.fs_errors import check_name_lengths

    check_name_lengths(target, "--json")  # with the temporary copy's suffix: refused before the features, not after
    from mechkit.io.locks import real_place
    from mechkit.io.replace import refuse_foreign_file

    # each by its real identity (links, .., ~, a bind mount): a bind mount of the run's folder had passed
    path, run_dir = real_place(target), real_place(report)
    run_dir = run_dir if run_dir.is_dir() else run_dir.parent
    if path.is_relative_to(run_dir):
        raise MechkitError(f"--json {target} is inside the run directory {run_dir}, whose files are the run's",
                           "write the figures elsewhere, e.g. --json rho.json")
    from mechkit.io.out import refuse_dot_dot_past_missing

    refuse_dot_dot_past_missing(Path(target), "file", "--json")  # nosuch/../x: found only after minutes of features
    from mechkit.io.atomic import refuse_special_file

    refuse_special_file(path)  # a pipe or a device named as --json: the rename would replace it with a file
    refuse_foreign_file(path, "taskselect_rho's --json")  # another run's file, or a model's: never replaced
    if path.is_dir() or not path.parent.is_dir():
        raise MechkitError(f"--json {target}: {'is a directory' if path.is_dir() else 'its folder does not exist'}",
                           "name a file in an existing folder, e.g. --json rho.json")


def write_json(path: Path, out: dict) -> None:
    """The figures as one file, written whole (a temporary file renamed over it) or not at all."""
    from mechkit.errors import MechkitError

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(out, indent=2))
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):  # the name the write failed on may fail here too
            tmp.unlink(missing_ok=True)
        raise MechkitError(f"cannot write --json {path}: {err.strerror}", "name a writable file, e.g. --json rho.json") \
            from None


if __name__ == "__main__":
    sys.exit(main())
