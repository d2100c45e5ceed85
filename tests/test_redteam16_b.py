"""Red-team pass 16 (b): what a confirming pass on option refusals and their fixes found (issue 32, class 11).

A refusal of several options ignored for one reason named the first alone, and its fix "drop it" dropped that
one: the rerun was refused for the next (``sweep --method attribution --executor ray --workers 2``: "drop it"
for --executor, then --workers). Now the refusal names them all, and its drop fix drops them all.
"""

from __future__ import annotations

import re

import pytest

from mechkit.options.option import OptionError


def _checks(plugin: str, options: dict) -> None:
    """The option checks a run makes before the model loads: the plugin's own, then the execution check."""
    from mechkit import registry
    from mechkit.executors import check_execution
    from mechkit.options.resolve import resolve_options

    params, _ = resolve_options(registry.get(plugin), options)
    check_execution(params)


def _dropped(plugin: str, options: dict, alternative: str) -> dict:
    """``options`` without the flags a "drop --a, --b and --c" alternative names."""
    from mechkit import registry

    names = {o.flag: o.name for o in registry.get(plugin).options}
    words = re.fullmatch(r"drop (.+)", alternative.strip())
    assert words, alternative
    flags = re.split(r", | and ", words.group(1))
    assert all(flag in names for flag in flags), alternative
    return {k: v for k, v in options.items() if k not in {names[flag] for flag in flags}}


SEVERAL_IGNORED = [  # (plugin, options, the options ignored for one reason, the other alternative's edit)
    ("sweep", {"method": "attribution", "executor": "ray", "workers": 2}, ("--executor", "--workers"),
     {"method": "both"}),
    ("prune", {"budget": 0.5, "executor": "ray", "workers": 2}, ("--executor", "--workers"), {"budget": None}),
    ("select-tasks", {"target": "capitalize", "executor": "ray", "workers": 2}, ("--executor", "--workers"),
     {"validate": True}),
    ("select-tasks", {"target": "capitalize", "executor": "ray", "workers": 2, "ray_address": "auto"},
     ("--executor", "--ray-address", "--workers"), None),
    ("ablate", {"heads": "0.1", "top_k": 3, "sweep": "1,2"}, ("--top-k", "--sweep"), None),
    ("ablate", {"heads": "0.1", "n_seqs": 5, "seg_len": 9}, ("--n-seqs", "--seg-len"), None),
]


@pytest.mark.parametrize(("plugin", "options", "flags", "other"), SEVERAL_IGNORED)
def test_a_refusal_of_several_ignored_options_names_them_all_and_its_fix_runs(plugin, options, flags, other):
    with pytest.raises(OptionError) as err:
        _checks(plugin, options)
    message, fix = str(err.value), err.value.fix
    assert all(flag in message for flag in flags), message
    first, _, rest = fix.partition(", or ")
    fixed = _dropped(plugin, options, first)
    assert all(fixed.get(o) is None for o in ("executor", "workers", "ray_address")) or plugin == "ablate"
    assert len(fixed) == len(options) - len(flags)
    _checks(plugin, fixed)  # the drop fix refuses nothing now
    if other is not None:  # the other alternative keeps every option, now read
        edited = {k: v for k, v in {**options, **other}.items() if v is not None}
        _checks(plugin, edited)


def test_one_ignored_option_keeps_its_drop_it_fix():
    with pytest.raises(OptionError) as err:
        _checks("sweep", {"method": "attribution", "workers": 2})
    assert "(and so would" not in str(err.value)
    assert err.value.fix.startswith("drop it, or pass --method both and add --executor ray")


def test_a_default_fix_drops_every_option_named():
    from mechkit.options import Option
    from mechkit.options.unused import refuse_ignored

    class Demo:
        options = (Option("top_k", int, 10, min=1), Option("sweep", str, None), Option("n", int, 5))

    with pytest.raises(OptionError) as err:
        refuse_ignored(Demo, {"top_k": 3, "sweep": "1,2", "n": 5}, ("top_k", "sweep", "n"), "ranks heads")
    assert str(err.value).startswith("--top-k ranks heads, so it would be ignored (and so would --sweep)")
    assert err.value.fix == "drop --top-k and --sweep"
