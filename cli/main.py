"""The ``mechkit`` command line: a thin layer over plugins, the registry and reports.

Plugin commands are built lazily from entry points, and nothing here imports torch, so
``mechkit --help`` stays fast. Every :class:`~mechkit.errors.MechkitError` becomes one line on
stderr and exit code 2.
"""

from __future__ import annotations

import sys

import click

from mechkit import __version__
from mechkit.cli.plugin_command import plugin_command
from mechkit.cli.taskvec import taskvec
from mechkit.errors import MechkitError


def _echo_err(message: str) -> None:
    click.echo(f"mechkit: error: {message}", err=True)


class MechkitGroup(click.Group):
    """Built-in commands plus one subcommand per installed plugin."""

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
def cli() -> None:
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
    """Print a summary table of the report at PATH (a run directory or its report.json)."""
    from mechkit.report import load_report, print_summary

    print_summary(load_report(path))


@cli.command("tasks")
def tasks_cmd() -> None:
    """List the task ids every plugin accepts."""
    from mechkit.tasks import list_tasks

    for task in list_tasks():
        click.echo(task)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: one clear line and exit code 2 for any user error."""
    try:
        cli.main(args=argv, prog_name="mechkit", standalone_mode=False)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        _echo_err("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        _echo_err("interrupted — finished steps are kept; rerun the same command to resume")
        sys.exit(130)
    except MechkitError as err:
        _echo_err(str(err))
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
