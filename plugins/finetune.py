"""``mechkit finetune``: make a task model Ψ*_T to take task vectors from.

Trains a copy of ``--model`` (full fine-tuning or LoRA, merged before saving) on the seeds' prompt
format for one task, with the loss on the answer only, and writes a loadable model directory
(``config.json``, ``model.safetensors``, tokenizer files; for LoRA also ``lora_adapter.*``) beside
``report.json``, so ``--model DIR`` and ``mechkit taskvec extract --finetuned DIR`` read it back.
The report records the recipe, the loss curve and zero-shot accuracy before and after on held-out
prompts (queries never seen in training). Training checkpoints every ``--checkpoint-every`` steps;
an interrupted run started again with the same options continues from the last checkpoint.
"""

from __future__ import annotations

from mechkit.options import NumberList, OptionError, TaskList
from mechkit.options.unused import given
from mechkit.plugin import Option, Plugin, Result, RunContext

SHOTS = NumberList(int, min=0, example="0,3")  # what mechkit.taskarith.finetune.parse_shots accepts, declared


class FinetunePlugin(Plugin):
    name = "finetune"
    version = "0.1.0"
    needs = frozenset({"weight_writes", "weight_reads", "gradients", "generation"})
    pruned = frozenset({"neurons", "heads", "uneven-heads", "layers"})  # docs/analyses/prune.md
    summary = "Fine-tune a copy of the model on a task (full or LoRA) and save it as a model directory."
    options = (
        Option("task", str, "capitalize", "Task id to train on (see `mechkit tasks`).", parse=TaskList(count=1)),
        Option("steps", int, 100, "Optimizer steps.", min=1),
        Option("lr", float, 1e-4, "AdamW learning rate.", min=0, min_exclusive=True),
        Option("method", str, "full", "Full fine-tuning or LoRA (merged into the weights).", choices=("full", "lora")),
        Option("rank", int, 8, "LoRA rank.", min=1),
        Option("lora_alpha", float, 16.0, "LoRA alpha (scale alpha/rank).", min=0, min_exclusive=True),
        Option("batch_size", int, 8, "Prompts per step.", min=1),
        Option("shots", str, "0", "Demonstrations per training prompt, comma-separated mix (e.g. 0,3).", parse=SHOTS),
        Option("data_seed", int, 1000, "Seed of the training prompts (distinct from evaluation's --seed).",
               min=0, max=2**63 - 1),
        Option("eval_n", int, 20, "Held-out zero-shot prompts for accuracy before/after.", min=1),
        Option("weight_decay", float, 0.0, "AdamW weight decay.", min=0),
        Option("checkpoint_every", int, 50, "Steps between resumable checkpoints (weights + AdamW state); 0: none.",
               min=0),
    )

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        """LoRA's options under --method full, refused before the model loads (it was refused after the load);
        an --lr past AdamW's float32 step (torch's overflow error after the load); an --lr × --weight-decay of 1
        or more, which no step survives (it "diverged" after the load, blamed on --lr);
        a --checkpoint-every the run never reaches (no checkpoint at all: a kill restarted from step 0)."""
        lora_only = [o.flag for o in cls.options if o.name in ("rank", "lora_alpha") and given(cls, parsed, o.name)]
        if parsed["method"] == "full" and lora_only:
            verb = "applies" if len(lora_only) == 1 else "apply"
            raise OptionError(f"{' and '.join(lora_only)} {verb} to --method lora, not to full fine-tuning",
                              f"drop {' and '.join(lora_only)}, or pass --method lora")
        from mechkit.taskarith.finetune import decay_problem, lr_problem

        # an --lr past float32 (AdamW's step overflowed inside torch, after the load); lr·decay ≥ 1: the decay
        # wrecks the weights at the first step
        problem = lr_problem(parsed["lr"]) or decay_problem(parsed["lr"], parsed["weight_decay"])
        if problem:
            raise OptionError(*problem)
        every, steps = parsed["checkpoint_every"], parsed["steps"]
        if given(cls, parsed, "checkpoint_every") and every >= steps:  # the last step writes the weights, not one
            raise OptionError(f"--checkpoint-every {every} saves a resumable checkpoint every {every} steps, and "
                              f"--steps {steps} ends first, so it would be ignored",
                              f"pass --checkpoint-every below {steps}, or 0 for none" if steps > 1 else
                              "pass --checkpoint-every 0 (one step leaves no room for a checkpoint), or more --steps")

    def run(self, ctx: RunContext) -> Result:
        from mechkit.eval.scoring import score_prompts
        from mechkit.model import load_model
        from mechkit.taskarith.finetune import Recipe, eval_prompts, finetune, model_files

        opts, model = ctx.options, ctx.model
        task = opts["task"][0]
        recipe = Recipe(task=task, steps=opts["steps"], lr=opts["lr"], method=opts["method"], rank=opts["rank"],
                        lora_alpha=opts["lora_alpha"], batch_size=opts["batch_size"], shots=opts["shots"],
                        seed=ctx.seed, data_seed=opts["data_seed"], eval_n=opts["eval_n"], eval_seed=ctx.seed,
                        weight_decay=opts["weight_decay"])
        held_out = eval_prompts(recipe)
        before = ctx.step("accuracy_before", lambda: score_prompts(model, held_out).as_dict())
        with ctx.progress() as bar:
            job = bar.add_task(f"finetune {task}", total=recipe.steps)
            trained = finetune(model, recipe, checkpoint=ctx.scratch("finetune"), checkpoint_every=opts["checkpoint_every"],
                               on_step=lambda i, loss: bar.update(
                                   job, completed=i + 1, description=f"finetune {task} loss {loss:.3f}"))
        after = score_prompts(load_model(trained.model, tokenizer=model.tokenizer), held_out).as_dict()
        files = model_files(trained, model.tokenizer)
        results = {
            "recipe": recipe.as_dict(),
            "losses": trained.losses,
            "accuracy_before": before,
            "accuracy_after": after,
            "model_files": sorted(files),
            "summary": {"task": task, "method": recipe.method, "steps": recipe.steps,
                        "loss": f"{_mean(trained.losses[:5]):.3f} -> {_mean(trained.losses[-5:]):.3f}",
                        "zero-shot accuracy": f"{before['accuracy']:.2f} -> {after['accuracy']:.2f}"},
        }
        return Result(results=results, figures={"loss": self._loss_plot(trained.losses, task)}, files=files,
                      finding=finding(results))

    @classmethod
    def writes(cls, params: dict) -> tuple[str, ...]:
        """The saved model's key files: checked against --out before the model loads."""
        return ("config.json", "model.safetensors")

    @classmethod
    def saved_model_bytes(cls, parsed: dict, handle) -> int:
        """The largest file the run writes, held to ``ulimit -f`` before training: the model, saved in float32
        whatever the loaded dtype (a bfloat16 model's own size passed, and the save failed after training), or,
        under full fine-tuning with checkpoints, a checkpoint (the weights and AdamW's two moments), refused here."""
        from mechkit.io.fs_errors import refuse_over_file_size_limit
        from mechkit.model.placement.ties import distinct_parameters

        n = sum(p.numel() for p in distinct_parameters(handle.model).values())
        every, steps = parsed.get("checkpoint_every", 0), parsed.get("steps", 0)
        if parsed.get("method", "full") == "full" and 0 < every < steps:  # LoRA's checkpoint holds the adapters alone
            refuse_over_file_size_limit(3 * 4 * n, f"the checkpoint finetune writes every {every} steps (the "
                                        "float32 weights and AdamW's two moments)")
        return 4 * n

    @classmethod
    def tables(cls, results: dict) -> list:
        """Before × after on the held-out prompts, and the training run in numbers."""
        from mechkit.report import Table, kv_table

        rows = [[label, r.get("accuracy"), r.get("logprob"), r.get("n")]
                for label, r in (("before", results["accuracy_before"]), ("after", results["accuracy_after"]))]
        recipe, losses = results["recipe"], results["losses"]
        training = {"task": recipe["task"], "method": recipe["method"] + (f" (rank {recipe['rank']})"
                                                                          if recipe["method"] == "lora" else ""),
                    "steps": recipe["steps"], "learning rate": recipe["lr"], "batch size": recipe["batch_size"],
                    "loss, first 5 steps": _mean(losses[:5]), "loss, last 5 steps": _mean(losses[-5:])}
        return [Table("Held-out zero-shot prompts", ["model", "accuracy", "answer log-prob", "prompts"], rows,
                      note="queries never seen in training", digits=3),
                kv_table("Training", training, digits=4)]

    @staticmethod
    def _loss_plot(losses: list[float], task: str):
        from mechkit.report import line_plot

        return line_plot(list(range(1, len(losses) + 1)), {"training loss": losses},
                         f"Fine-tuning on {task}", "step", "loss (answer tokens)")


def _mean(xs: list[float]) -> float:
    return sum(xs) / max(1, len(xs))


def finding(results: dict) -> str:
    """What fine-tuning did to held-out zero-shot accuracy, and to the training loss."""
    recipe, losses = results["recipe"], results["losses"]
    before, after = results["accuracy_before"], results["accuracy_after"]
    method = "LoRA" if recipe["method"] == "lora" else "full"
    return (f"Fine-tuning ({method}, {recipe['steps']} steps) on {recipe['task']} takes held-out zero-shot accuracy "
            f"from {before['accuracy']:.2f} to {after['accuracy']:.2f} ({after['n']} prompts); the training loss goes "
            f"from {_mean(losses[:5]):.3f} to {_mean(losses[-5:]):.3f}.")
