"""The CLI reference page, generated from the commands themselves so it cannot drift from ``--help``.

Each plugin command's options are the plugin's :class:`mechkit.Option` declarations (plus the options
every plugin shares); built-in commands are read from their click definitions. The page shows each
command's options as a table and, folded below it, the exact ``--help`` text.
"""

from __future__ import annotations

import click
from click.testing import CliRunner

PAGE_INTRO = """# CLI reference

Generated when the site is built, from the commands and the plugins' `Option` declarations
(`mechkit/options/option.py`), so every table here matches `mechkit COMMAND --help`. Each command's
exact `--help` text is folded below its table. Values are checked before any model loads: a bad value
is one line naming the problem and the fix, and exit status 2.
"""


def walk(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    """Every command under ``group``, depth first, as ``(path, command)``; groups come before their children."""
    ctx = click.Context(group, info_name="mechkit")
    found = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        found.append(((*prefix, name), command))
        if isinstance(command, click.Group):
            found += walk(command, (*prefix, name))
    return found


def help_text(path: tuple[str, ...]) -> str:
    """What ``mechkit PATH --help`` prints, at a fixed width so the page is the same on every machine."""
    from mechkit.cli.main import cli

    result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=100, prog_name="mechkit")
    if result.exit_code != 0:
        raise RuntimeError(f"mechkit {' '.join(path)} --help failed: {result.output}")
    return result.output


def option_flags(command: click.Command) -> list[str]:
    """The long flags a command accepts, in declaration order (``--help`` itself excluded)."""
    flags = []
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            flags += [f for f in param.opts + param.secondary_opts if f.startswith("--") and f != "--help"]
    return flags


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _row(param: click.Option, ctx: click.Context) -> str:
    declared = getattr(param.type, "option", None)  # the plugin's Option, where the parameter came from one
    flags = " / ".join(f"`{f}`" for f in param.opts + param.secondary_opts if f.startswith("--"))
    if param.is_flag:
        value = "flag"
    else:
        value = f"`{declared.display_metavar() if declared else param.make_metavar(ctx)}`"
    if declared is not None:
        notes = "; ".join(declared.help_extra())
        help_ = declared.help
    else:
        default = param.default if param.show_default and param.default is not None and param.default is not False \
            and param.default != "" else None
        notes = f"default: {default}" if default is not None else ""
        help_ = param.help or ""
    return f"| {flags} | {value} | {_cell(help_)} | {_cell(notes)} |"


def command_section(path: tuple[str, ...], command: click.Command) -> str:
    """One command: heading (its anchor is the command, e.g. ``#taskvec-apply``), summary, table, help."""
    ctx = click.Context(command, info_name=" ".join(path))
    lines = [f"## {' '.join(path)}", "", _cell(command.help or command.short_help or ""), ""]
    if isinstance(command, click.Group):
        ctx_group = click.Context(command)
        subs = [n for n in command.list_commands(ctx_group)]
        lines += ["Subcommands: " + ", ".join(f"[`{n}`](#{'-'.join((*path, n))})" for n in subs) + ".", ""]
    options = [p for p in command.params if isinstance(p, click.Option) and not p.hidden and p.name != "help"]
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    if arguments:
        lines += ["Arguments: " + ", ".join(f"`{a.make_metavar(ctx)}`" for a in arguments) + ".", ""]
    if options:
        lines += ["| Option | Value | What it does | Default and bounds |", "|---|---|---|---|"]
        lines += [_row(p, ctx) for p in options]
        lines.append("")
    body = "\n".join("    " + line if line else "" for line in help_text(path).splitlines())
    lines += [f'??? note "`mechkit {" ".join(path)} --help`"', "", "    ```text", body, "    ```", ""]
    return "\n".join(lines)


def page() -> str:
    """The whole reference page, as Markdown."""
    from mechkit.cli.main import cli

    sections = [command_section(path, command) for path, command in walk(cli)]
    return PAGE_INTRO + "\n" + "\n".join(sections)
