"""The ``mechkit`` command line: a thin layer over plugins, the registry and reports.

Plugin commands are built lazily from entry points, and nothing here imports torch, so
``mechkit --help`` stays fast. Every :class:`~mechkit.errors.MechkitError` and every click usage
error (an unknown option, a value click cannot convert) becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import click

from mechkit import __version__
from mechkit.cli.plugin_command import plugin_command
from mechkit.cli.taskvec import taskvec
from mechkit.errors import MechkitError
from mechkit.io.quiet import ENV, quiet, set_verbose


def _echo_err(message: str) -> None:
    click.echo(f"mechkit: error: {message}", err=True)


def _echo_interrupted() -> None:
    """The Ctrl-C line, on a line of its own: a terminal has just echoed ``^C`` (and a progress bar may
    have been drawn) where the cursor stands."""
    if sys.stderr.isatty():
        click.echo("", err=True)
    _echo_err("interrupted — finished steps are kept; rerun the same command to resume")


def _one_line(message: str) -> str:
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


def run_one_line(call) -> Any:
    """``call()``, with every user error (click's usage and type errors included) as one line on stderr.

    Exits 2 for a :class:`MechkitError` or a click usage error, 130 when interrupted.
    """
    try:
        return call()
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except click.exceptions.NoArgsIsHelpError as err:  # `mechkit`, `mechkit report`: their help, as asked
        click.echo(err.ctx.get_help() if err.ctx is not None else err.format_message())
        sys.exit(0)
    except click.UsageError as err:
        where = f" — see `{err.ctx.command_path} --help`" if err.ctx is not None else ""
        _echo_err(_one_line(err.format_message()) + where)
        sys.exit(err.exit_code)
    except click.ClickException as err:
        _echo_err(_one_line(err.format_message()))
        sys.exit(err.exit_code)
    except click.exceptions.Abort as err:  # click turns Ctrl-C into Abort
        if isinstance(err.__cause__, KeyboardInterrupt):
            _echo_interrupted()
        else:
            _echo_err("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        _echo_interrupted()
        sys.exit(130)
    except MechkitError as err:
        _echo_err(_one_line(str(err)))
        sys.exit(err.exit_code)
    except Exception as err:  # a full disk, a quota, a read-only place: the environment, one line
        from mechkit.io.fs_errors import one_line

        line = one_line(err)  # an OSError, or safetensors' wrapper of one: the line mk.run raises
        if line is None:
            raise
        _echo_err(_one_line(str(line)))
        sys.exit(line.exit_code)


@contextlib.contextmanager
def verbosity(argv: list[str]):
    """``--verbose`` anywhere on the command line turns third-party output back on for this command
    (:mod:`mechkit.io.quiet`). Read before click parses, because everything the command does, parsing
    included, runs inside :func:`~mechkit.io.quiet.quiet`."""
    before = os.environ.get(ENV)
    if "--verbose" in argv:
        set_verbose(True)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


VERBOSE_HELP = "Show third-party libraries' progress bars, warnings and log lines (also MECHKIT_VERBOSE=1)."


class MechkitGroup(click.Group):
    """Built-in commands plus one subcommand per installed plugin."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """In standalone mode (the console script, ``CliRunner``) every user error is one line, exit 2."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        with verbosity(sys.argv[1:] if args is None else list(args)), quiet():
            code = run_one_line(lambda: super(MechkitGroup, self).main(args, prog_name, complete_var,
                                                                        standalone_mode=False, **extra))
        sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)

    def list_commands(self, ctx: click.Context) -> list[str]:
        from mechkit import registry

        return sorted(set(super().list_commands(ctx)) | set(registry.entries()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        builtin = super().get_command(ctx, cmd_name)
        if builtin is not None:
            return builtin
        from mechkit import registry

        return plugin_command(cmd_name) if cmd_name in registry.entries() else None


@click.group(cls=MechkitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mechkit")
@click.option("--verbose", is_flag=True, help=VERBOSE_HELP)
def cli(verbose: bool) -> None:
    """mechkit: find the components that matter, prove it causally, edit and prune models."""


cli.add_command(taskvec)


@cli.group()
def plugins() -> None:
    """Inspect installed plugins."""


@plugins.command("list")
def plugins_list() -> None:
    """Every plugin with its version and distribution; broken ones with their error."""
    from rich.console import Console
    from rich.table import Table

    from mechkit import registry

    table = Table(title="mechkit plugins")
    for column in ("plugin", "version", "distribution", "summary"):
        table.add_column(column)
    for name, entry in registry.entries().items():
        try:
            cls = entry.load()
            table.add_row(name, cls.version, f"{entry.dist} {entry.dist_version}", cls.summary)
        except MechkitError:
            table.add_row(name, "-", f"{entry.dist} {entry.dist_version}", f"[red]failed to load: {entry.error}[/red]")
    Console().print(table)


@cli.group()
def report() -> None:
    """Read reports written by plugin runs."""


@report.command("show")
@click.argument("path", type=click.Path())
def report_show(path: str) -> None:
    """Print the finding and the tables of the report at PATH (a run directory or its report.json)."""
    from mechkit.report import load_report, print_summary
    from mechkit.runner import report_tables

    report = load_report(path)
    print_summary(report, tables=report_tables(report))


def _check_compare_page(out: str) -> None:
    """One line where ``OUT/compare.html`` cannot be written as a file: a directory or a pipe there was told
    to "name a file inside it", which `report compare` has no option for."""
    from pathlib import Path

    page = Path(out) / "compare.html"
    if os.path.lexists(page) and not page.is_symlink() and not page.is_file():
        raise MechkitError(f"{page} is not a regular file (a directory, a pipe or a device), and `report compare` "
                           "writes its page there", "remove it, or choose another --out")


@report.command("compare")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--out", type=click.Path(), default=None,
              help="Directory for compare.html (default: a new one under ./mechkit-runs/).")
@click.option("--force", is_flag=True, help="Write into a non-empty --out.")
def report_compare(paths: tuple[str, ...], out: str | None, force: bool) -> None:
    """Put several reports of one plugin side by side (models, seeds or settings as columns) in compare.html."""
    from rich.console import Console

    from mechkit.report import compare_runs, default_out_dir, print_compare, write_compare
    from mechkit.runner import report_tables

    if out is not None:
        _check_compare_page(out)
    cmp = compare_runs(paths, tables_of=report_tables)
    where = write_compare(cmp, out if out is not None else default_out_dir(f"compare-{cmp.plugin}"), force=force)
    console = Console()
    print_compare(cmp, console=console)
    console.print(f"comparison: {where}/compare.html", markup=False, highlight=False)


@cli.group()
def cache() -> None:
    """Models and run steps mechkit keeps under $MECHKIT_CACHE (default ~/.cache/mechkit)."""


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"  # unreachable: GB is the last unit


@cache.command("list")
def cache_list() -> None:
    """Every cached model (converted GGUF files, the toy model) and the run-step cache."""
    from mechkit.io.disk_cache import FOREIGN, cache_root, list_cache

    root = cache_root()
    entries = list_cache(root)
    click.echo(f"cache: {root}")
    if not entries:
        click.echo("(empty)")
        return
    rows = [(e.name, e.kind, _human_size(e.size),
             e.made.astimezone().strftime("%Y-%m-%d %H:%M") if e.made else "?", e.source) for e in entries]
    header = ("name", "kind", "size", "made", "source")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4])
    ours = sum(e.size for e in entries if e.name != FOREIGN)  # what `cache clear --all` would free
    left = any(e.name == FOREIGN for e in entries)
    click.echo(f"total: {_human_size(ours)}" + (" (not counting the unmarked folders)" if left else ""))


@cache.command("clear")
@click.argument("names", nargs=-1)
@click.option("--all", "all_entries", is_flag=True, help="Remove every model and run step mechkit cached.")
def cache_clear(names: tuple[str, ...], all_entries: bool) -> None:
    """Remove cached entries by NAME (as `mechkit cache list` shows them: gguf/…, toy/…, runs, leftovers), or --all."""
    from mechkit.io.disk_cache import cache_root, clear_cache, list_cache

    removed = clear_cache(names, all_entries=all_entries)
    for name, size in removed:
        click.echo(f"removed {name} ({_human_size(size)})")
    if not removed:  # an entry a running mechkit holds is kept (warned about above), so "empty" is not always true
        click.echo("nothing removed: the cache is empty" if not list_cache(cache_root()) else
                   "nothing removed: nothing matched, or what matched is in use by a running mechkit "
                   "(`mechkit cache list` shows what is there)")


@cli.command("tasks")
def tasks_cmd() -> None:
    """List the task ids every plugin accepts."""
    from mechkit.tasks import list_tasks

    for task in list_tasks():
        click.echo(task)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: one clear line and exit code 2 for any user error."""
    with verbosity(sys.argv[1:] if argv is None else list(argv)), quiet():
        code = run_one_line(lambda: cli.main(args=argv, prog_name="mechkit", standalone_mode=False))
    if isinstance(code, int) and not isinstance(code, bool) and code != 0:
        sys.exit(code)


if __name__ == "__main__":
    main()
