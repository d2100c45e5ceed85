"""Layer scans of an activation-vector study, one layer per unit, and the checks made before one starts.

The ``icl-vectors`` plugin's dev and test scans go through a run's ``map_units`` (``--executor``: this
process, or Ray workers that each load the model once); the scan and its units live here, in the core.
"""

from __future__ import annotations


def check_before_work(tasks: list[str], shots: int, seed: int) -> None:
    """Refuse, before anything is computed, tasks whose prompts have too few demonstrations to shuffle
    (e.g. ioi, which has no input:/output: demonstrations)."""
    from mechkit.tasks.shuffled import shuffled_label_prompts

    for task in tasks:
        shuffled_label_prompts(task, n=1, shots=shots, seed=seed)


def layer_scan_study(*args, map_units, **kwargs):
    """A :class:`~mechkit.actvec.VectorStudy` whose dev and test layer scans run one unit per layer
    through ``map_units`` (``ctx.map_units``), each layer kept as its own step."""
    from mechkit.actvec.select import choose
    from mechkit.actvec.study import VectorStudy, conditions

    class LayerScanStudy(VectorStudy):
        def scan(self, vec, prompts: list, configs: list[tuple[float, int]], key: str) -> dict:
            """:func:`mechkit.actvec.study.sweep`'s result, assembled from one unit per layer."""
            rows = map_units(scan_units, (vec, prompts, configs, self.batch_size), self.layers,
                             [f"{self.task}|{key}|L{layer}" for layer in self.layers])
            return {"scales": [x for x, _ in configs], "spans": [k for _, k in configs],
                    **{m: [[row[m][i] for row in rows] for i in range(len(configs))] for m in ("accuracy", "logprob")}}

        def choose(self, method, vec) -> dict:
            scales = self.fv_scales if method == "function-vector" else [1.0]
            key = f"{method}|dev|{scales}" + (f"|spans={self.spans}" if self.spans != [1] else "")
            dev = self.scan(vec, self.dev, [(x, k) for x in scales for k in self.spans], key)
            vec.layer, vec.scale, vec.span = choose(dev, self.layers)
            return dev

        def run(self, method, vector=None):
            vec = vector or self.extract(method)
            dev = None if vector is not None else self.choose(method, vec)
            at = f"x{vec.scale}" + (f"|span={vec.span}" if vec.span != 1 else "")
            test = self.scan(vec, self.test["zero-shot"], [(vec.scale, vec.span)], f"{method}|test|{at}")
            cond = self.step(f"{method}|conditions|L={vec.layer}|{at}",
                             lambda: conditions(self.handle, vec, self.test, self.batch_size))
            test = {k: test[k][0] for k in ("accuracy", "logprob")}
            return vec, {"layer": vec.layer, "scale": vec.scale, "span": vec.span, "dev": dev, "test": test,
                         "conditions": cond, "heads": vec.heads, "aie": vec.info.get("aie")}

    return LayerScanStudy(*args, **kwargs)


def scan_units(handle, shared: tuple, units: list):
    """Each unit a layer -> the vector's accuracy and log-prob there, one per (scale, span) config
    (``None`` where the span runs past the last layer). ``shared``: ``(vector, prompts, configs, batch_size)``."""
    from mechkit.actvec.study import sweep

    vec, prompts, configs, batch_size = shared
    for layer in units:
        row = sweep(handle, vec, prompts, [layer], configs, batch_size)
        yield {m: [cells[0] for cells in row[m]] for m in ("accuracy", "logprob")}
