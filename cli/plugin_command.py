"""One click command per plugin, built from its declared options (nothing imports torch here).

Each plugin option's value goes through its declaration (:meth:`mechkit.options.Option.check`)
while click parses the command line, so a bad value is the same one line as from Python
(``--batch-size 0 is below 1 — pass --batch-size 1 or more``, exit code 2) before anything loads;
``--help`` shows each option's default, bounds and choices.
"""

from __future__ import annotations

from typing import Any

import click

from mechkit.errors import MechkitError
from mechkit.options import Option

COMMON = ("model", "seed", "out", "force", "device", "dtype", "device_map", "max_memory", "offload_folder", "backend",
          "remote")


class DeclaredType(click.ParamType):
    """A click type that checks values with an :class:`Option` declaration (raising its one-line error)."""

    def __init__(self, option: Option) -> None:
        self.option = option
        self.name = option.type.__name__ if option.type in (int, float, bool) else "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return self.option.check(value)[0]  # the typed value; the runner checks it again into ctx.options

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return self.option.display_metavar()

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
        from click.shell_completion import CompletionItem

        return [CompletionItem(c) for c in self.option.choices or () if c.startswith(incomplete)]


class ParsedType(click.ParamType):
    """A click type whose value goes through one of mechkit's parsers (raising its one-line error)."""

    def __init__(self, name: str, parse) -> None:
        self.name, self._parse = name, parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value if not isinstance(value, str) else self._parse(value)


def dispatch_options() -> list[click.Option]:
    """``--device-map``, ``--max-memory`` and ``--offload-folder``: one model over several devices, CPU
    memory and disk (accelerate). Their syntax is checked while parsing; the devices before the model loads."""
    from mechkit.model.placement.request import parse_device_map, parse_max_memory

    return [
        click.Option(["--device-map"], type=ParsedType("map", parse_device_map), default=None,
                     help="Spread the model over devices: auto, balanced, balanced_low_0, sequential, one device, "
                          "a .json file or MODULE=DEVICE pairs (devices: cuda:N, cpu, disk)."),
        click.Option(["--max-memory"], type=ParsedType("limits", parse_max_memory), default=None,
                     help="Memory per device for --device-map, e.g. cuda:0=10GiB,cpu=30GiB (alone: implies auto)."),
        click.Option(["--offload-folder"], type=click.Path(), default=None,
                     help="Where weights that fit on no device are offloaded (disk)."),
    ]


def backend_options() -> list[click.Option]:
    """``--backend`` and ``--remote``: where the forwards run (checked, with the plugin's needs, before any work)."""
    return [
        click.Option(["--backend"], type=click.Choice(["native", "nnsight"]), default="native", show_default=True,
                     help="Run forwards with PyTorch hooks (native) or as nnsight traces (nnsight)."),
        click.Option(["--remote"], type=click.Choice(["local", "ndif"]), is_flag=False, flag_value="ndif",
                     default=None,
                     help="With --backend nnsight: run on NDIF (--remote or --remote ndif; NDIF_API_KEY, a hub id) "
                          "or in nnsight's offline simulation of a server (--remote local)."),
    ]


def declared_option(opt: Option) -> click.Option:
    """The click option of a plugin option: its flag, type check, default and help with bounds."""
    if opt.is_flag:
        return click.Option([f"{opt.flag}/--no-{opt.flag[2:]}", opt.name], default=bool(opt.default), help=opt.help)
    extra = opt.help_extra()
    text = f"{opt.help}  [{'; '.join(extra)}]" if extra else opt.help
    return click.Option([opt.flag, opt.name], type=DeclaredType(opt), default=opt.default, show_default=False,
                        help=text)


def plugin_command(name: str) -> click.Command:
    """The click command of the plugin registered as ``name`` (a stub naming the error if it fails to load)."""
    from mechkit import registry

    entry = registry.entries()[name]
    try:
        cls = entry.load()
    except MechkitError as err:
        message = str(err)

        @click.command(name=name, short_help=f"(failed to load: {entry.error})",
                       context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
        def broken() -> None:
            raise MechkitError(message)

        return broken

    params = [
        click.Option(["--model"], default="llama", show_default=True,
                     help="Model: llama/smollm2 (embedded), tiny:FAMILY, a directory, a .gguf file or a hub id."),
        click.Option(["--seed"], type=int, default=0, show_default=True, help="Random seed."),
        click.Option(["--out"], type=click.Path(), default=None,
                     help="Output directory (default: a new one under ./mechkit-runs/)."),
        click.Option(["--force"], is_flag=True, help="Overwrite a report already in --out."),
        click.Option(["--device"], default=None, help="cpu or cuda (default: cuda when available)."),
        click.Option(["--dtype"], default=None, help="float32, bfloat16 or float16 (default: bf16 on cuda, fp32 on cpu)."),
        *dispatch_options(),
        *backend_options(),
        click.Option(["--verbose"], is_flag=True, help="Show third-party libraries' progress bars, warnings and log "
                                                       "lines (also MECHKIT_VERBOSE=1)."),
    ]
    params += [declared_option(opt) for opt in cls.options]

    def callback(**kwargs) -> None:
        from mechkit.runner import run_plugin

        kwargs.pop("verbose")  # read from the command line before parsing (mechkit.cli.main.verbosity)
        common = {k: kwargs.pop(k) for k in COMMON}
        run_plugin(cls, **common, **kwargs).show()  # the same summary as run.show() in Python

    return click.Command(name=name, params=params, callback=callback, help=cls.summary, short_help=cls.summary)
