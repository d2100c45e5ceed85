"""One click command per plugin, built from its declared options (nothing imports torch here)."""

from __future__ import annotations

import click

from mechkit.errors import MechkitError

COMMON = ("model", "seed", "out", "force", "device", "dtype")


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
    ]
    for opt in cls.options:
        kind = click.Choice(opt.choices) if opt.choices else opt.type
        if opt.is_flag:
            params.append(click.Option([f"{opt.flag}/--no-{opt.flag[2:]}", opt.name], default=bool(opt.default),
                                       help=opt.help))
        else:
            params.append(click.Option([opt.flag, opt.name], type=kind, default=opt.default,
                                       show_default=opt.default is not None, help=opt.help))

    def callback(**kwargs) -> None:
        from rich.console import Console

        from mechkit.report import print_summary
        from mechkit.runner import run_plugin

        common = {k: kwargs.pop(k) for k in COMMON}
        run = run_plugin(cls, **common, **kwargs)
        console = Console()
        print_summary(run.report, console=console)
        console.print(f"report: {run.out_dir}/report.json  ({run.out_dir}/report.html)")

    return click.Command(name=name, params=params, callback=callback, help=cls.summary, short_help=cls.summary)
