"""The nnsight backend's cost: time and peak memory as ratios to the native backend on the same runs.

Each (workload, backend) pair runs in a fresh subprocess on the same model and inputs:

- ``forward``: plain forwards over the batches (no hooks).
- ``record``: every layer's head outputs recorded (``blocks.*.attn.hook_z``).
- ``detect``: ``head_scores`` (attention patterns read at every layer and reduced).
- ``ablate``: task scoring (exact match) with 5 heads zero-ablated.
- ``attribution``: attribution patching (one forward and one backward per batch).
- ``exact``: the exact ablation sweep (native replays partial forwards; nnsight runs one whole forward
  per batch and layer with the batch repeated once per head).

Backends: ``native`` (PyTorch hooks), ``nnsight`` (each forward one trace, in process) and
``remote-local`` (mechkit's strict simulation of an NDIF server: every job serialised, deserialised
with mechkit hidden, executed on the copies, results pickled back — the client-side cost of a remote
run without the network). For the sweeps (``exact``, ``attribution``) ``remote-local`` groups the
traces into one job (a ``model.session``); ``remote-trace`` is the same run sent trace by trace (one
job per trace), to show what grouping saves. The first run of each worker measures the peak RSS
increase and is the warm-up; then the median of ``--repeats`` runs is timed. Results must agree across
backends: each worker also returns a checksum of what it computed and the script checks they match.
The table gives the traces and remote jobs of one run.

    python bench/nnsight_backend.py [--quick] [--threads N] [--model tiny:llama|llama] [--workloads a,b]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import common

WORKLOADS = ("forward", "record", "detect", "ablate", "attribution", "exact")
# name -> (backend, remote, traces per remote job: None for the backend's own choice)
BACKENDS = {"native": ("native", None, None), "nnsight": ("nnsight", None, None),
            "remote-local": ("nnsight", "local", None), "remote-trace": ("nnsight", "local", 1)}
GROUPED = ("attribution", "exact")  # the workloads whose traces a remote run groups into jobs


def _sizes(quick: bool, model: str) -> dict:
    tiny = model.startswith("tiny:")
    if quick:
        return {"n_seqs": 8, "seg_len": 10, "batch": 4, "prompts": 8, "exact_prompts": 8, "shots": 2, "exact_shots": 2}
    # The exact sweep is the costly one (n_heads × n_layers ablations): on the embedded model 2 prompts of
    # 2 shots, 270 heads, 31 traces a run (about two minutes on one CPU thread).
    return {"n_seqs": 32 if tiny else 16, "seg_len": 25, "batch": 8, "prompts": 16 if tiny else 8,
            "exact_prompts": 16 if tiny else 2, "shots": 4 if tiny else 5, "exact_shots": 4 if tiny else 2}


def _workload(name: str, handle, sizes: dict):
    """``run() -> float`` (a checksum of the result) for one workload on ``handle``."""
    import torch

    from mechkit.eval.evaluation import evaluate, task_prompts
    from mechkit.heads.effects import attribution_effects, exact_effects
    from mechkit.heads.scores import head_scores, repeated_tokens

    bs = sizes["batch"]
    tokens = repeated_tokens(handle, n_seqs=sizes["n_seqs"], seg_len=sizes["seg_len"], seed=0)
    exact = name == "exact"
    prompts = task_prompts(["capitalize"], sizes["exact_prompts" if exact else "prompts"],
                           sizes["exact_shots" if exact else "shots"], 0)
    a = handle.anatomy
    heads = ",".join(f"{(i * 7) % a.n_layers}.{(i * 5) % a.n_heads}" for i in range(5))

    def forward():
        with torch.no_grad():
            return sum(float(handle(tokens[s:s + bs])[:, -1].sum()) for s in range(0, len(tokens), bs))

    def record():
        total = 0.0
        with torch.no_grad():
            for s in range(0, len(tokens), bs):
                with handle_record(handle, "blocks.*.attn.hook_z") as cache:
                    handle(tokens[s:s + bs])
                total += sum(float(v.sum()) for v in cache.values())
        return total

    def detect():
        return float(sum(v.sum() for v in head_scores(handle, tokens, sizes["seg_len"], batch_size=bs).scores.values()))

    def ablate():
        from mechkit.interventions import ablate as ablated

        with ablated(handle, heads, mode="zero"):
            return float(evaluate(handle, prompts, bs)["capitalize"]["logprob"])

    def attribution():
        return float(attribution_effects(handle, prompts["capitalize"], bs).logprob.sum())

    def exact():
        return float(exact_effects(handle, prompts["capitalize"], bs).logprob.sum())

    return {"forward": forward, "record": record, "detect": detect, "ablate": ablate,
            "attribution": attribution, "exact": exact}[name]


def handle_record(handle, names):
    from mechkit.hooking import record

    return record(handle, names)


def worker(args) -> None:
    common.go_offline()
    threads = common.set_threads(args.threads)
    import mechkit as mk

    backend, remote, per_job = BACKENDS[args.backend]
    handle = mk.load_model(args.model, device="cpu", backend=backend, remote=remote)
    if per_job is not None:
        handle.backend.traces_per_job = per_job
    common.prefault(handle)
    run = _workload(args.workload, handle, _sizes(args.quick, args.model))
    mem, checksum = common.peak_rss_increase(run)
    timing = common.median_time(run, args.repeats, warmup=0)
    runs = 1 + args.repeats
    traces = handle.backend.info().get("traces")
    log = getattr(handle.backend, "log", None)
    Path(args.result).write_text(json.dumps({
        "memory": mem, "time": timing, "checksum": checksum, "threads": threads,
        "traces": None if traces is None else traces // runs,  # per run
        "jobs": None if log is None else len(log.jobs) // runs,
        "server": None if log is None else log.summary(),  # all runs together
    }))


def main() -> None:
    p = common.base_parser("nnsight backend overhead: time and peak memory as ratios to native")
    p.add_argument("--model", default="tiny:llama", help="tiny:FAMILY or llama (the embedded model)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--worker", action="store_true", help=argparse_hidden())
    p.add_argument("--workload", default=None, help=argparse_hidden())
    p.add_argument("--backend", default=None, help=argparse_hidden())
    p.add_argument("--result", default=None, help=argparse_hidden())
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    workloads = [w for w in args.workloads.split(",") if w]
    rows, data = [], {"model": args.model, "quick": args.quick, "repeats": args.repeats, "results": {},
                      "environment": common.environment(args.threads)}
    for workload in workloads:
        found = {}
        for name in (n for n in BACKENDS if n != "remote-trace" or workload in GROUPED):
            with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
                cmd = [sys.executable, __file__, "--worker", "--model", args.model, "--workload", workload,
                       "--backend", name, "--result", tmp.name, "--repeats", str(args.repeats)]
                cmd += ["--quick"] if args.quick else []
                cmd += ["--threads", str(args.threads)] if args.threads else []
                subprocess.run(cmd, check=True)
                found[name] = json.loads(Path(tmp.name).read_text())
        base = found["native"]
        for name, got in found.items():
            same = abs(got["checksum"] - base["checksum"]) <= 1e-4 * max(1.0, abs(base["checksum"]))
            t, b = got["time"]["median_s"], base["time"]["median_s"]
            m, bm = got["memory"]["peak_increase_mib"], base["memory"]["peak_increase_mib"]
            rows.append((workload, name, t, t / b, m, m / bm if bm > 0.5 else None, got["traces"], got.get("jobs"),
                         same))
        data["results"][workload] = found
        data["table"] = rows
        path = common.write_json(f"nnsight-{args.model.replace(':', '-')}", data, args.out)  # after each workload
    print(common.table(rows, ("workload", "backend", "median s", "time ×native", "peak MiB", "memory ×native",
                              "traces", "jobs", "same result")))
    print(f"written: {path}")
    if not all(r[-1] for r in rows):
        sys.exit("results differ between backends")


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
