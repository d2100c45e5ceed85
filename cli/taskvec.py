"""``mechkit taskvec``: extract, combine, inspect and sweep weight-space task vectors.

Nothing here imports torch at import time (``mechkit --help`` stays fast); ``sweep`` is the
``taskvec-sweep`` plugin's command, built lazily like every plugin command.

Bad input is one line and exit 2 before anything is written: non-finite numbers (``--scale nan``,
``--weights inf,1``), unknown ``--task`` ids, vector files that do not read back as task vectors,
vectors of different base models combined, and (``apply``) vectors of another base than ``--base``
unless ``--allow-other-base`` is given.
"""

from __future__ import annotations

import click

from mechkit.cli.plugin_command import dispatch_options
from mechkit.errors import MechkitError

MERGE_METHODS = ("task_arithmetic", "ties", "dare", "dare_ties")


class FiniteFloat(click.ParamType):
    """A float that must be finite: ``nan`` and ``inf`` are refused with the option's name."""

    name = "float"

    def convert(self, value, param, ctx):
        import math

        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


FINITE = FiniteFloat()


class TaskvecGroup(click.Group):
    """The fixed subcommands plus ``sweep``, which is the taskvec-sweep plugin's command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), "sweep"})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "sweep":
            from mechkit.cli.plugin_command import plugin_command

            command = plugin_command("taskvec-sweep")
            command.name = "sweep"
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=TaskvecGroup)
def taskvec() -> None:
    """Weight-space task vectors: ΔΨ = Ψ_ft − Ψ0 and task arithmetic Ψ0 + Σ λ_i ΔΨ_i."""


@taskvec.command("extract")
@click.option("--base", default="llama", show_default=True, help="Base model spec (as --model elsewhere).")
@click.option("--finetuned", required=True, type=click.Path(), help="Fine-tuned model directory.")
@click.option("--out", required=True, type=click.Path(), help="Task-vector file to write (.safetensors).")
@click.option("--embeddings", type=click.Choice(("error", "truncate", "skip")), default="error", show_default=True,
              help="When vocabularies differ: fail, use the shared rows, or leave embeddings out.")
@click.option("--task", "tasks", default=None, help="Task id(s) to record (default: from the fine-tune report).")
@click.option("--force", is_flag=True, help="Overwrite --out.")
def extract_cmd(base: str, finetuned: str, out: str, embeddings: str, tasks: str | None, force: bool,
                device_map=None, max_memory=None, offload_folder=None) -> None:
    """ΔΨ = Ψ_ft − Ψ0, streamed tensor by tensor from the fine-tuned safetensors.

    A base larger than memory can be dispatched (--device-map, --max-memory, --offload-folder, as for
    every plugin): its stored weights are read one tensor at a time."""
    from pathlib import Path

    from mechkit.taskarith.vector import check_vector_out
    from mechkit.tasks import parse_tasks

    check_vector_out(out, force, _local(base, finetuned))
    task_ids = parse_tasks(tasks) if tasks is not None else None  # before the model loads
    from mechkit.model import load_model
    from mechkit.taskarith import extract

    dispatched = device_map is not None or max_memory is not None or offload_folder is not None
    handle = load_model(base, device=None if dispatched else "cpu", dtype="float32", device_map=device_map,
                        max_memory=max_memory, offload_folder=offload_folder)
    tv = extract(handle, Path(finetuned), embeddings=embeddings, tasks=task_ids)
    tv.save(out, force=force, inputs=_local(base, finetuned))
    _print_summary(tv, out)


extract_cmd.params.extend(dispatch_options())


def _local(*specs: str) -> tuple[str, ...]:
    """The specs that name local files or directories (inputs an --out must not hold)."""
    from pathlib import Path

    return tuple(s for s in specs if s and (Path(s).expanduser().exists() or Path(s).is_symlink()))


def _vector_paths(vectors: tuple[str, ...]) -> tuple[str, ...]:
    return _local(*(item.partition("=")[2] or item for item in vectors))


def _load_named(vectors: tuple[str, ...]) -> dict:
    from pathlib import Path

    from mechkit.taskarith import TaskVector

    named = {}
    for item in vectors:
        name, sep, path = item.partition("=")
        if not sep:
            path, name = item, Path(item).name.split(".")[0].replace("-", "_")
        if not name.isidentifier():
            raise MechkitError(f"--vector name {name!r} is not a plain identifier", "use --vector cap=FILE")
        if name in named:
            raise MechkitError(f"--vector name {name!r} is given twice", "name each vector once: -v a=FILE1 -v b=FILE2")
        named[name] = TaskVector.load(path)
    return named


def combine_options(command):
    """The options ``merge`` and ``apply`` share: which vectors, how to combine and compress them."""
    options = [
        click.option("--vector", "-v", "vectors", multiple=True, required=True,
                     help="NAME=FILE (repeatable); a bare FILE is named after its file name."),
        click.option("--expr", default=None, help="Arithmetic over the names, e.g. 'cap + 0.5*past - low'."),
        click.option("--method", type=click.Choice(MERGE_METHODS), default=None,
                     help="Or merge all vectors with this method."),
        click.option("--weights", default=None, help="Comma-separated weight per vector (merge methods)."),
        click.option("--density", type=FINITE, default=1.0, show_default=True, help="TIES: fraction of entries kept."),
        click.option("--p", "p", type=FINITE, default=0.0, show_default=True, help="DARE: drop probability."),
        click.option("--seed", type=int, default=0, show_default=True, help="DARE mask seed."),
        click.option("--scale", type=FINITE, default=1.0, show_default=True, help="λ applied to the combined vector."),
        click.option("--rank", type=int, default=None, help="Low-rank: truncated SVD rank per matrix."),
        click.option("--energy", type=FINITE, default=None,
                     help="Low-rank: keep this fraction of squared singular mass."),
        click.option("--sparsity-density", type=FINITE, default=None, help="Keep the top fraction by magnitude."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@taskvec.command("merge")
@combine_options
@click.option("--out", required=True, type=click.Path(), help="Task-vector file to write.")
@click.option("--force", is_flag=True, help="Overwrite --out.")
def merge_cmd(vectors, expr, method, weights, density, p, seed, scale, rank, energy, sparsity_density, out,
              force) -> None:
    """Combine task vectors (expression or merge method), optionally compress, write a new vector."""

    from mechkit.taskarith.vector import check_vector_out

    check_vector_out(out, force, _vector_paths(vectors))
    tv = _combine(vectors, expr, method, weights, density, p, seed, scale, rank, energy, sparsity_density)
    tv.save(out, force=force, inputs=_vector_paths(vectors))
    _print_summary(tv, out)


def _combine(vectors, expr, method, weights, density, p, seed, scale, rank, energy, sparsity_density):
    from mechkit.taskarith import evaluate_expression, merge
    from mechkit.taskarith.merge import example_weights

    if (expr is None) == (method is None):
        raise MechkitError("pass exactly one of --expr and --method", "e.g. --expr 'cap + past' or --method ties")
    ignored = [flag for flag, value, default in (("--weights", weights, None), ("--density", density, 1.0),
                                                 ("--p", p, 0.0), ("--seed", seed, 0)) if value != default]
    if expr is not None and ignored:  # an expression carries its own weights: these would be silently ignored
        raise MechkitError(f"{', '.join(ignored)} appl{'y' if len(ignored) > 1 else 'ies'} to --method merges, "
                           "not to --expr",
                           "write the weights into the expression (e.g. --expr '0.7*cap + 0.3*past'), "
                           "or merge with --method")
    if method is not None:
        _refuse_unread_merge_options(method, density, p, seed)
    named = _load_named(vectors)
    if expr is not None:
        tv = evaluate_expression(expr, named) * scale if scale != 1.0 else evaluate_expression(expr, named)
    else:
        try:
            ws = [FINITE.convert(w, None, None) for w in weights.split(",")] if weights else None
        except click.BadParameter:
            raise MechkitError(f"malformed --weights {weights!r}: each must be a finite number",
                               f"pass one number per vector, e.g. {example_weights(len(named))}") from None
        tv = merge(list(named.values()), method, weights=ws, density=density, p=p, seed=seed, scale=scale)
    if rank is not None or energy is not None:
        tv = tv.low_rank(rank=rank, energy=energy)
    if sparsity_density is not None:
        tv = tv.sparsify(sparsity_density)
    return tv


def _refuse_unread_merge_options(method: str, density: float, p: float, seed: int) -> None:
    """--density is read by ties alone, --p and --seed by dare and dare_ties alone: under another method
    they were silently ignored (``--method task_arithmetic --density 0.2`` merged every entry)."""
    readers = {"--density": ("ties",), "--p": ("dare", "dare_ties"), "--seed": ("dare", "dare_ties")}
    for flag, value, default in (("--density", density, 1.0), ("--p", p, 0.0), ("--seed", seed, 0)):
        if value != default and method not in readers[flag]:
            raise MechkitError(f"{flag} applies to --method {' and '.join(readers[flag])}, and --method {method} "
                               "does not read it, so it would be ignored",
                               f"drop {flag}, or pass --method {readers[flag][0]}")


@taskvec.command("apply")
@click.option("--base", default="llama", show_default=True, help="Base model spec.")
@combine_options
@click.option("--out", required=True, type=click.Path(), help="Merged model directory to write.")
@click.option("--force", is_flag=True, help="Overwrite --out.")
@click.option("--allow-other-base", is_flag=True,
              help="Apply vectors extracted from another base model than --base (refused by default).")
def apply_cmd(base, vectors, expr, method, weights, density, p, seed, scale, rank, energy, sparsity_density, out,
              force, allow_other_base) -> None:
    """Write Ψ0 + combined vector as a loadable model directory (usable as --model DIR).

    The vectors must have been extracted from --base (same weights, or the same architecture when
    the weights were hashed in another dtype) unless --allow-other-base is given."""
    from pathlib import Path

    from mechkit.io import check_out
    from mechkit.io.replace import refuse_foreign_model
    from mechkit.model import load_model
    from mechkit.taskarith import save_merged

    check_out(out, force, kind="dir", inputs=(*_vector_paths(vectors), *_local(base)))  # before the model loads
    if force and Path(out).is_dir():  # a model another run saved there is not ours to replace
        refuse_foreign_model(Path(out), "taskvec apply")
    tv = _combine(vectors, expr, method, weights, density, p, seed, scale, rank, energy, sparsity_density)

    handle = load_model(base, device="cpu", dtype="float32")
    save_merged(handle, tv, out, force=force, allow_other_base=allow_other_base)
    click.echo(f"merged model: {out}  (tasks: {', '.join(tv.meta.get('tasks', [])) or '-'})")


@taskvec.command("info")
@click.argument("path", type=click.Path())
def info_cmd(path: str) -> None:
    """Tasks, size, norm, layers, operations and recipe of a task-vector file."""
    from mechkit.taskarith import TaskVector

    _print_summary(TaskVector.load(path), path)


def _print_summary(tv, path: str) -> None:
    import json

    click.echo(f"task vector: {path}")
    for key, value in tv.summary().items():
        if value not in (None, [], {}):
            text = value if isinstance(value, (str, int, float)) else json.dumps(value, default=str)
            click.echo(f"  {key:8s} {text}")
