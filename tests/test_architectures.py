"""Measured architecture coverage: every causal-LM type of the installed transformers, built tiny from its
config class and checked on each mechkit primitive (:mod:`tools.arch_coverage`).

The suite fails on any ``failing`` type, on any type the committed matrix (docs/architectures.json, the
docs' supported-architectures table) lists as ``works`` that no longer does, and on a committed matrix
that no longer matches what the installed transformers measures (regenerate it with
``python -m tools.arch_coverage``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools import arch_coverage as coverage  # noqa: E402

pytest.importorskip("nnsight")
# The families the coverage issue names: each must stay "works".
NAMED = ("mixtral", "olmoe", "qwen3_moe", "gpt_oss", "phi", "opt", "gptj", "bloom", "falcon", "mpt", "starcoder2")


@pytest.fixture(scope="module")
def measured() -> dict:
    import warnings

    from mechkit.io.quiet import quiet

    with warnings.catch_warnings(), quiet():
        warnings.simplefilter("ignore")
        return coverage.measure_all()


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads(coverage.MATRIX.read_text())


def _status(matrix: dict, model_type: str) -> str:
    return matrix["types"].get(model_type, {}).get("status", "absent")


def test_no_type_fails(measured):
    failing = {t: row["reason"] for t, row in measured["types"].items() if row["status"] == "failing"}
    assert not failing, f"{len(failing)} failing: {failing}"


def test_no_type_that_worked_stopped(measured, committed):
    lost = {t: measured["types"].get(t, {}).get("reason", "gone from transformers")
            for t, row in committed["types"].items() if row["status"] == "works" and _status(measured, t) != "works"}
    assert not lost, f"worked in docs/architectures.json, no longer: {lost}"


def test_committed_matrix_is_current(measured, committed):
    changed = {t: (_status(committed, t), row["status"]) for t, row in measured["types"].items()
               if _status(committed, t) != row["status"]}
    assert not changed, (f"docs/architectures.json is stale (committed, measured): {changed}; "
                         "regenerate it with `python -m tools.arch_coverage`")


def test_the_named_families_work(measured):
    assert {t: _status(measured, t) for t in NAMED} == dict.fromkeys(NAMED, "works")


def test_every_unsupported_type_says_why(measured):
    silent = [t for t, row in measured["types"].items() if row["status"] != "works" and not row.get("reason")]
    assert not silent
