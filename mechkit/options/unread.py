"""Each built-in plugin's options that a run would not read, refused before the model loads.

One rule per plugin, called from its ``check_options`` (:func:`mechkit.options.unused.refuse_ignored` says the
line). Each was a silent ignore: ``ablate --heads 0.1 --sweep 2,3`` ablated the one head and reported k=1 alone,
``prune --reconstruct none --ridge 0.5`` refitted nothing, ``select-tasks --steps 5`` without ``--validate``
trained nothing, ``icl-vectors --method task-vector --top-k 5`` picked no heads, ``adapt --margin 0.05 --margin-prompts 3`` timed no margin prompt and reported an adherence
target it never aimed at, ``compose --parts steps --shots 0,2`` measured K = 2 alone and listed the grid.
"""

from __future__ import annotations

import contextlib
from typing import Any

from mechkit.options.option import OptionError
from mechkit.options.unused import given, given_flag, refuse_head_options, refuse_ignored

STATIC_GUIDES = ("random", "magnitude", "wanda", "flap")  # prune's guides scored without a gradient
VALIDATE_ONLY = ("seeds", "steps", "budget", "batch_size", "lr", "eval_n", "eval_shots", "draws", "no_div_size",
                 "transfer_seeds", "executor", "ray_address", "workers")  # select-tasks: the --validate fine-tunes'
FV_ONLY = ("top_k", "n_cie", "fv_scales")  # icl-vectors: read by the function vector alone
RAY_ONLY = ("executor", "ray_address", "workers")  # where units run: ignored where a run maps none


def ray_fix(parsed: dict) -> str:
    """The rest of a fix that brings in a reader of --workers or --ray-address: ``--executor ray`` where it is
    not given, as the execution check then demands it (``prune --budget 0.5 --workers 2``'s second fix,
    "drop --budget", was then refused for --workers without --executor ray)."""
    if parsed.get("executor") == "ray":
        return ""
    flags = [f for n, f in (("workers", "--workers"), ("ray_address", "--ray-address")) if parsed.get(n) is not None]
    return f" and add --executor ray (which {flags[0]} needs)" if flags else ""


def ablate(cls: Any, parsed: dict) -> None:
    """--top-k and --sweep where every head is named, --top-k beside --sweep, --from and the scoring options
    where no head is ranked by a score, --n-seqs and --seg-len beside --from, --baseline-seeds under --baseline
    none."""
    refuse_head_options(cls, parsed, ("top_k", "sweep"), ("n_seqs", "seg_len"))
    setting(parsed)
    if parsed["sweep"]:  # --sweep "" is no sweep: --top-k is then the one k
        refuse_ignored(cls, parsed, ("top_k",), "sets the one k of a run, and --sweep gives the ks",
                       "drop --top-k, or drop --sweep")
    if parsed["baseline"] == "none":
        refuse_ignored(cls, parsed, ("baseline_seeds",), "counts the random-head draws, and --baseline none draws "
                       "none", "drop --baseline-seeds, or drop --baseline none")


def setting(parsed: dict) -> None:
    """--setting where no task is a composite (a+b): it changes nothing. The prompts refused it too, after the
    model had loaded (:func:`mechkit.eval.evaluation.task_prompts`); the task ids say it before."""
    tasks = parsed["tasks"]
    if parsed["setting"] is not None and tasks and not any("+" in task for task in tasks):
        raise OptionError(f"--setting {parsed['setting']} applies to composite tasks (a+b), and none of "
                          f"{', '.join(tasks)} is one", "drop --setting, or add a composite such as capitalize+swap")


def shuffle(cls: Any, parsed: dict) -> None:
    """--top-k where every head is named, --from where no head is ranked by a score, the prompt options under
    --tasks '' (--n-seqs and --seg-len also set the held-out loss: they always count)."""
    refuse_head_options(cls, parsed, ("top_k",), ())
    setting(parsed)
    if not parsed["tasks"]:
        refuse_ignored(cls, parsed, ("n", "shots", "setting"), "sets the task prompts, and --tasks '' scores no "
                       "task", "drop it, or name tasks to score (--tasks capitalize)")


def prune(cls: Any, parsed: dict) -> None:
    """--ridge and --sequential outside --reconstruct lsq, guides past the first under --budget (its search
    follows one guide's order), --protect-top-k without an induction or combined guide, --guide-text-weight
    where every guide is static (no gradient scores)."""
    if parsed["reconstruct"] != "lsq":
        refuse_ignored(cls, parsed, ("ridge", "sequential"), f"sets the least-squares refit, and --reconstruct "
                       f"{parsed['reconstruct']} refits nothing", "drop it, or pass --reconstruct lsq")
    guides = [g.partition("@")[0] for g in parsed["guide"]]
    effective = [(g.partition("@")[0], g.partition("@")[2] or parsed["allocation"]) for g in parsed["guide"]]
    twice = next((g for g, e in zip(parsed["guide"], effective, strict=True) if effective.count(e) > 1), None)
    if twice is not None:  # magnitude,magnitude@global under --allocation global: one guide, two identical rows
        kept = list(dict.fromkeys(effective))
        raise OptionError(f"--guide {','.join(parsed['guide'])} names {twice.partition('@')[0]} twice with the "
                          f"allocation {effective[parsed['guide'].index(twice)][1]} (--allocation gives a guide "
                          "without @ its own), which measures the same rows twice",
                          f"name it once (--guide {','.join(g if a == parsed['allocation'] else f'{g}@{a}' for g, a in kept)})")
    if parsed["budget"] is not None:
        refuse_ignored(cls, parsed, RAY_ONLY, "fans the guide × sparsity grid's rows out, and --budget searches "
                       "one row at a time in this process",
                       f"drop it, or drop --budget to measure a --sparsity grid{ray_fix(parsed)}")
        if len(guides) > 1:
            refuse_ignored(cls, parsed, ("guide",), f"names {len(guides)} guides, and --budget searches the plan of "
                           "the first alone", f"pass one guide (--guide {parsed['guide'][0]}), or drop --budget")
        from mechkit.pruning.study import unsearched

        none = unsearched(parsed["target"])  # known from the options: refused before the model loads
        if none is not None:
            raise OptionError(*none)
        guides = guides[:1]
    if not {"induction", "combined"} & set(guides) and parsed["protect_top_k"]:  # 0 asks for no protection: kept
        refuse_ignored(cls, parsed, ("protect_top_k",), f"protects heads under the induction and combined guides, "
                       f"and the run's guides ({','.join(guides)}) hold neither",
                       f"drop --protect-top-k, or {guide_fix(parsed, 'induction')}{heads_fix(parsed)}")
    if all(g in STATIC_GUIDES for g in guides):
        refuse_ignored(cls, parsed, ("guide_text_weight",), f"weighs the gradient scores, and the run's guides "
                       f"({','.join(guides)}) compute none",
                       f"drop --guide-text-weight, or {guide_fix(parsed, 'attribution')}")
    calib_text(cls, parsed, guides)
    prune_targets(cls, parsed)


def calib_text(cls: Any, parsed: dict, guides: list[str]) -> None:
    """--calib-text-weight where nothing reads the calibration statistics it mixes text into: random and
    magnitude guides (magnitude's layer scores aside), no refit or mean, no sensitivity allocation, no budget
    search. (--calib still decides which held-out prompts are scored: those that calibrate are dropped.)"""
    static = all(g in ("random", "magnitude") for g in guides) and not (
        "magnitude" in guides and "layers" in parsed["target"])
    sensitivity = parsed["allocation"] == "sensitivity" or any(g.endswith("@sensitivity") for g in parsed["guide"])
    if static and parsed["reconstruct"] == "none" and not sensitivity and parsed["budget"] is None:
        refuse_ignored(cls, parsed, ("calib_text_weight",), "mixes text into the calibration statistics, and with "
                       f"--guide {','.join(guides)} and --reconstruct none nothing reads them",
                       "drop --calib-text-weight, or " + ("pass --reconstruct mean (or lsq)" if {"neurons", "heads"}
                                                           & set(parsed["target"]) else guide_fix(parsed, "wanda")))


def prune_targets(cls: Any, parsed: dict) -> None:
    """The options of a unit type --target leaves out: --gqa and --protect-top-k (heads), --allocation where
    neither neurons nor heads are spread over layers, and a sensitivity allocation (MLP channels) without neurons
    (heads then went globally, as under global)."""
    targets = parsed["target"]
    spec = f"--target {','.join(targets)}"
    sparsity_targets(cls, parsed, spec)
    if not {"neurons", "heads"} & set(targets):  # whole layers: nothing reads what they fed, nothing is refitted
        refuse_ignored(cls, parsed, ("ridge", "sequential"), f"sets the least-squares refit of what reads removed "
                       f"neurons and heads, and {spec} removes whole layers alone", "drop it, or add neurons or "
                       "heads to --target")
        layers_reconstruct(parsed["reconstruct"], spec, "--reconstruct")
    if "heads" not in targets:
        refuse_ignored(cls, parsed, ("gqa",), f"sets how heads are pruned, and {spec} prunes none",
                       f"drop it, or add heads: {target_fix(parsed, 'heads')}")
    if not {"heads", "layers"} & set(targets) and parsed["protect_top_k"]:  # a layer holding a protected head is kept whole; 0: none
        refuse_ignored(cls, parsed, ("protect_top_k",), f"keeps heads (and the layers holding them), and {spec} "
                       "removes neither", f"drop it, or add heads: {target_fix(parsed, 'heads')}")
    overrides = [g for g in parsed["guide"] if g.partition("@")[2]]  # GUIDE@ALLOCATION
    if not {"neurons", "heads"} & set(targets):
        refuse_ignored(cls, parsed, ("allocation",), f"spreads neurons and heads over the layers, and {spec} "
                       "removes whole layers alone", "drop --allocation, or add neurons or heads to --target")
        if overrides:
            raise OptionError(f"--guide {overrides[0]} sets how neurons and heads spread over the layers, and {spec} "
                              "removes whole layers alone, so it would be ignored",
                              f"drop @{overrides[0].partition('@')[2]} from --guide, or add neurons or heads to --target")
    if "neurons" not in targets:
        if parsed["allocation"] == "sensitivity":
            raise OptionError(f"--allocation sensitivity spreads MLP channels by measured sensitivity, and {spec} "
                              "prunes no neurons (its heads would go globally), so it would be ignored",
                              f"pass --allocation global, or add neurons: {target_fix(parsed, 'neurons')}")
        sensitive = [g for g in overrides if g.partition("@")[2] == "sensitivity"]
        if sensitive:
            raise OptionError(f"--guide {sensitive[0]} spreads MLP channels by measured sensitivity, and {spec} "
                              "prunes no neurons (its heads would go globally), so it would be ignored",
                              f"drop @sensitivity from --guide, or add neurons: {target_fix(parsed, 'neurons')}")


def sparsity_targets(cls: Any, parsed: dict, spec: str) -> None:
    """A ``--sparsity TARGET=F`` naming a unit type --target leaves out: it was pruned anyway (``--target heads
    --sparsity neurons=0.3`` removed neurons), while the rules above and the run's report (MoE refusal, the saved
    model's size floor, --gqa) went by --target; a unit type named twice (the last fraction alone was used)."""
    text = parsed["sparsity"].text if parsed["sparsity"] is not None else ""
    named = [part.partition("=")[0].strip() for part in text.split(",") if "=" in part]
    twice = next((t for t in named if named.count(t) > 1), None)
    if twice is not None:  # one level: the last fraction replaced the others unsaid
        given = ",".join(dict.fromkeys(part.partition("=")[2].strip() for part in text.split(",")
                                       if part.partition("=")[0].strip() == twice))  # the user's own fractions
        why = (f"--sparsity {text} names {twice} twice, and TARGET=F pairs are one level (the last {twice}= alone "
               "would be used)")
        if set(named) == {twice} and list(parsed["target"]) == [twice]:  # a list of fractions keeps every level
            raise OptionError(why, f"give {twice}= once; for several levels of {twice} pass fractions with --target "
                              f"{twice} (--target {twice} --sparsity {given})")
        pairs = {t: v for t, v in (part.replace(" ", "").split("=", 1) for part in text.split(",") if "=" in part)
                 if t in parsed["target"]}  # last wins; a pair --target leaves out is not kept (refused next)
        fraction = next(iter(pairs.values()), "0.5")
        with contextlib.suppress(ValueError):  # as unnamed_targets gives a --target part no pair names
            fraction = fraction if float(fraction) >= 0.5 else "0.5"
        pairs.update((t, fraction) for t in parsed["target"] if t not in pairs)
        once = (f"give {twice}= once" if twice in parsed["target"] else
                f"drop {twice}= ({spec} leaves {twice} out; or add it to --target and give it once)")
        raise OptionError(why, f"{once} (--sparsity {','.join(f'{t}={v}' for t, v in pairs.items())}); "
                          f"several levels of a mix of targets are separate runs, one --sparsity each")
    outside = [t for t in dict.fromkeys(named) if t not in parsed["target"]]
    if outside:
        pairs = dict(part.replace(" ", "").split("=", 1) for part in text.split(","))
        fraction = pairs[named[0]]
        missing = [t for t in parsed["target"] if t not in named]  # each fix must give these a fraction too
        more = ",".join(f"{t}={fraction}" for t in missing)
        kept = ",".join([*(f"{t}={pairs[t]}" for t in named if t not in outside), *([more] if more else [])])
        them = "it" if len(outside) == 1 else "them"
        raise OptionError(f"--sparsity {text} prunes {', '.join(outside)}, and {spec} leaves {them} out",
                          f"add {them} to --target (--target {','.join([*parsed['target'], *outside])}"
                          + (f" --sparsity {text},{more}" if more else "") + f"), or drop "
                          f"{', '.join(t + '=' for t in outside)} from --sparsity (--sparsity {kept})")
    unnamed_targets(cls, parsed, named, text)


def unnamed_targets(cls: Any, parsed: dict, named: list[str], text: str) -> None:
    """A --target part that ``--sparsity TARGET=F`` pairs give no fraction: nothing of it was pruned, and its
    options (--gqa, --protect-top-k for heads) went unread (``--target neurons,heads --sparsity neurons=0.3``
    pruned no heads). A bare fraction (``--sparsity 0.3``) is every target's, so it never leaves one out."""
    missing = [t for t in parsed["target"] if named and t not in named]
    if not missing:
        return
    kept = [t for t in parsed["target"] if t not in missing]
    head_options = [given_flag(o, parsed[o.name]) for o in cls.options
                    if "heads" in missing and o.name in ("gqa", "protect_top_k") and given(cls, parsed, o.name)]
    fraction = dict(part.split("=", 1) for part in text.replace(" ", "").split(","))[named[0]]
    with contextlib.suppress(ValueError):  # at least a half where the given one is smaller: neurons=0.01 made
        fraction = fraction if float(fraction) >= 0.5 else "0.5"  # heads=0.01 (and 0.2 layers=0.2), removing none
    them = "it" if len(missing) == 1 else "them"
    raise OptionError(f"--target {','.join(parsed['target'])} names {', '.join(missing)}, and --sparsity {text} "
                      f"gives {them} no fraction, so no {' or '.join(missing)} would be pruned",
                      f"add {them} to --sparsity (--sparsity {text},{','.join(f'{t}={fraction}' for t in missing)}), "
                      f"or drop {them} from --target (--target {','.join(kept)})"
                      + "".join(f" and drop {flag}" for flag in head_options))


def layers_reconstruct(method: str, spec: str, flag: str) -> None:
    """``mean`` where only whole layers go: its bias stands in for removed neurons' and heads' outputs, and
    removing a block leaves none (:func:`mechkit.pruning.slicing.compensation`), so the report's "mean" was never
    applied."""
    if method == "mean":
        raise OptionError(f"{flag} mean adds the mean output of removed neurons and heads as a bias, and {spec} "
                          "removes whole layers alone, so it would be ignored",
                          f"drop {flag}, or add neurons or heads to {spec.split()[0]}")


def guide_fix(parsed: dict, guide: str) -> str:
    """How to bring in a guide that reads an option: add it to --guide, or, under --budget (one guide searched),
    pass it instead (adding it was then refused for naming two guides)."""
    if parsed["budget"] is not None:
        return f"pass --guide {guide} instead (--budget searches one guide)"
    return f"add it: --guide {','.join(parsed['guide'])},{guide}"


def heads_fix(parsed: dict) -> str:
    """The rest of --protect-top-k's fix where --target prunes neither heads nor layers (it keeps the heads, and
    the layers holding them: a guide alone would protect nothing)."""
    targets = parsed["target"]
    return "" if {"heads", "layers"} & set(targets) else f", with {target_fix(parsed, 'heads')}"


def target_fix(parsed: dict, target: str) -> str:
    """``--target`` with ``target`` added (neurons first, as the others' order goes), and, where --sparsity gives
    TARGET=F pairs, its fraction too: a part added without one is refused (:func:`unnamed_targets`)."""
    targets = parsed["target"]
    spec = f"--target {','.join(['neurons', *targets] if target == 'neurons' else [*targets, target])}"
    text = parsed["sparsity"].text if parsed["sparsity"] is not None else ""
    if "=" not in text:
        return spec
    fraction = text.replace(" ", "").split(",")[0].partition("=")[2]
    return f"{spec} --sparsity {text},{target}={fraction}"


def adapt(cls: Any, parsed: dict) -> None:
    """The margin calibration's options under --margin, --min-cv with one task (no task signal is fitted),
    --protect-top-k outside the induction guide, the static pruning's options under --prune-budgets ''."""
    if parsed["margin"] is not None:
        refuse_ignored(cls, parsed, ("adherence", "margin_prompts", "margin_plans", "debias"), "calibrates the "
                       "margin, and --margin gives it by hand", "drop it, or drop --margin to calibrate the margin")
    if len(parsed["tasks"]) < 2:  # the signal tells tasks apart: one task fits none (SignalStage.signal)
        refuse_ignored(cls, parsed, ("min_cv",), f"sets when the task signal is trusted, and one task "
                       f"(--tasks {','.join(parsed['tasks'])}) fits no signal", "drop --min-cv, or pass two or more "
                       "tasks (--tasks capitalize,past-tense)")
    if parsed["guide"] != "induction":
        refuse_ignored(cls, parsed, ("protect_top_k",), f"keeps the blocks of induction heads under --guide "
                       f"induction, and --guide is {parsed['guide']}", "drop --protect-top-k, or pass --guide induction")
    if parsed["token_layers"] is not None and not parsed["token_layers"] and parsed["token_keep"]:  # blank: none
        refuse_ignored(cls, parsed, ("token_keep",), "sets the shares kept after a --token-layers block, and "
                       "--token-layers '' selects no tokens", "drop --token-keep, or give --token-layers (e.g. auto)")
    elif not parsed["token_keep"] and parsed["token_layers"]:  # blocks named, no share kept after them
        raise OptionError(f"--token-layers {','.join(map(str, parsed['token_layers']))} selects tokens after these "
                          "blocks, and --token-keep '' keeps no share there, so it would be ignored",
                          "give --token-keep (e.g. 0.5,0.3), or pass --token-layers ''")
    if not parsed["prune_budgets"]:
        refuse_ignored(cls, parsed, ("prune_targets", "prune_reconstruct"), "sets the static pruning compared, and "
                       "--prune-budgets '' runs none", "drop it, or give --prune-budgets (e.g. 0.7)")
    elif not {"neurons", "heads"} & set(parsed["prune_targets"]):
        layers_reconstruct(parsed["prune_reconstruct"], f"--prune-targets {','.join(parsed['prune_targets'])}",
                           "--prune-reconstruct")


def icl_vectors(cls: Any, parsed: dict) -> None:
    """The function vector's options (its heads, their indirect effects, its scales) under --method task-vector."""
    if parsed["method"] == "task-vector" and parsed["load_vector"] is None:
        refuse_ignored(cls, parsed, FV_ONLY, "sets the function vector, and --method task-vector extracts none",
                       "drop it, or pass --method function-vector (or both)")


def compose_shots(cls: Any, parsed: dict, parts: set[str]) -> None:
    """A --shots grid without the study part (the others read its largest K alone), and --shots beside
    --effect-shots where no part reads it."""
    if "study" in parts:
        return
    if len(parsed["shots"]) > 1 and ("steps" in parts or parsed["effect_shots"] is None):
        refuse_ignored(cls, parsed, ("shots",), "is a grid of the study part, and --parts without study reads its "
                       "largest K alone", f"pass that K alone (--shots {max(parsed['shots'])}), or add study to "
                       "--parts")
    if "steps" not in parts and parsed["effect_shots"] is not None:
        refuse_ignored(cls, parsed, ("shots",), "sets the study's and steps' K, and --effect-shots gives the only K "
                       "these parts read", "drop --shots")


def select_tasks(cls: Any, parsed: dict) -> None:
    """The validation fine-tunes' options without --validate; the embedding options a representation does not
    read (--position under actvec, which reads the last token, and lora-grad, which embeds no residual;
    --layer under lora-grad), unless --validate's ρ table embeds every
    representation (--transfer-seeds above 0), which reads them all."""
    if not parsed["validate"]:
        refuse_ignored(cls, parsed, VALIDATE_ONLY, "sets the validation fine-tunes, which run only with --validate",
                       f"drop it, or pass --validate{ray_fix(parsed)}")
    if parsed["validate"] and parsed["transfer_seeds"]:  # every representation is embedded for the ρ table
        return
    rep = parsed["representation"]
    fix = ("drop it, or pass --transfer-seeds 1 or more (--validate's ρ table then embeds every representation)"
           if parsed["validate"] else "drop it, or pass --validate (its ρ table embeds every representation)")
    if rep in ("actvec", "lora-grad"):
        reads = "reads the last token of each context" if rep == "actvec" else "embeds LoRA gradients, not a token"
        refuse_ignored(cls, parsed, ("position",), f"picks the token embedded, and --representation {rep} {reads}",
                       fix)
    if rep == "lora-grad":
        refuse_ignored(cls, parsed, ("layer",), "picks the block whose residual stream is embedded, and "
                       "--representation lora-grad embeds LoRA gradients (--grad-blocks picks their blocks)", fix)


def sweep(cls: Any, parsed: dict) -> None:
    """--setting without a composite task; the execution options under --method attribution (only the exact
    sweep's units go to --executor)."""
    setting(parsed)
    if parsed["method"] == "attribution":
        refuse_ignored(cls, parsed, RAY_ONLY, "fans the exact sweep's layers out, and --method attribution runs "
                       "one forward and backward per batch in this process",
                       f"drop it, or pass --method both{ray_fix(parsed)}")


def refuse_no_kv_groups(anatomy: Any, option: str, fix: str) -> None:
    """``option`` (a ``--gqa group``) moves or removes whole KV groups, and a model with one KV head per query
    head in every layer has none: it ran as the default with only a table note. Called as the run starts,
    before any work (the model's anatomy says it)."""
    if not any(anatomy.kv_heads_in(layer) and anatomy.groups_in(layer) > 1 for layer in range(anatomy.n_layers)):
        raise OptionError(f"{option} acts on grouped-query attention's KV groups, and this model has one KV head per "
                          "query head, so it would have no effect", fix)


def gqa_before_load(parsed: dict, spec: Any, kv_groups: bool | None) -> None:
    """``--gqa group`` where the model's config (read from ``spec`` before the load,
    :func:`mechkit.model.sources.peek.has_kv_groups`) has no KV groups: refused before the model loads, not
    after (:func:`refuse_no_kv_groups` stays for what only the loaded model tells)."""
    if parsed.get("gqa") == "group" and "heads" in parsed.get("target", ["heads"]) and kv_groups is False:
        raise OptionError(f"--gqa group acts on grouped-query attention's KV groups, and {spec}'s config has one KV "
                          "head per query head, so it would have no effect",
                          f"drop --gqa group (its default, --gqa {'slot' if 'target' in parsed else 'query'}, does the "
                          "same on this model)")


def prune_model(anatomy: Any, targets, gqa: str, budget: float | None = None) -> None:
    """prune's options this model cannot honour, in one line as the run starts (before any work): --target
    neurons on a mixture of experts (experts, not neurons), heads normalised together (they cannot be
    sliced apart), --gqa group without KV groups (every head is its own slot: the default's plan), and a
    --budget whose targets this model cannot lose a unit of (a 1-layer model's layers: the search ran, and its
    fixes could not help)."""
    if budget is not None:
        budget_on_model(anatomy, targets)
    if "neurons" in targets:
        anatomy.refuse_moe("dense MLP neurons to prune", "pass --target heads,layers")
    if "heads" in targets:
        anatomy.refuse_joint_head_norm("pruning heads", "pass --target layers")
        if gqa == "group":
            refuse_no_kv_groups(anatomy, "--gqa group", "drop --gqa group: --gqa slot already removes each head "
                                "with its keys and values")
            if anatomy.n_kv_heads == 1:  # the one group of a layer is always kept: no plan removes a head
                raise OptionError("--gqa group removes whole groups of heads sharing keys and values, and this model "
                                  "has one such group per layer, which each layer keeps, so no head would go",
                                  "drop --gqa group: --gqa slot removes heads within the group")


def budget_on_model(anatomy: Any, targets) -> None:
    """--budget where the targets this model can lose a unit of leave the search no mix (see
    :func:`mechkit.pruning.study.unsearched`): one line naming what it can lose, before the search."""
    from mechkit.pruning.study import unsearched

    can = {"layers": anatomy.n_layers > 1, "neurons": anatomy.d_mlp > 1 and not getattr(anatomy, "is_moe", False),
           "heads": anatomy.n_heads > 1}
    left = [t for t in targets if can.get(t)]
    if unsearched(left) is None:
        return
    cannot = [t for t in targets if not can.get(t)]
    more = [t for t in ("neurons", "layers") if can[t] and t not in targets]
    raise OptionError(f"--budget with --target {','.join(targets)} searches no plan on this model: it cannot lose "
                      f"{' or '.join(cannot) or 'what the search prunes'} (each mix prunes neurons or layers)",
                      f"add {more[0]} to --target (--target {','.join([*targets, more[0]])})" if more else
                      "pass --sparsity instead of --budget")


def prune_levels(anatomy: Any, levels: list[dict[str, float]], guides: list[str], allocation: str, gqa: str) -> None:
    """A --sparsity that removes no unit of this model, in one line before any work (it rounds to none: a row
    labelled with it and a saved "pruned" model equal to the dense one), naming the smallest that removes one;
    and one that asks for more than the model can lose (a row labelled 0.9 that removed half), naming the most."""
    from mechkit.pruning.select import fit_levels, same_effect

    allocations = tuple(dict.fromkeys(g.partition("@")[2] or allocation for g in guides))
    found = fit_levels(anatomy, levels, allocations, gqa)  # both checks, every level, every guide: one fix for all
    if found is None and len(levels) > 1:
        found = same_effect(anatomy, levels, allocations, gqa)  # two labels of one plan: two rows the same
    if found is not None:
        raise OptionError(*found)
