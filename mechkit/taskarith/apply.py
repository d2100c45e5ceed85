"""Apply task vectors to a loaded model reversibly, or write the merged model as a directory.

:class:`TaskArithmetic` snapshots every parameter a vector touches the first time it touches it and
sets weights to ``Ψ0 + Σ λ_i τ_i`` *from the snapshot* each time :meth:`~TaskArithmetic.set` is
called, so a λ sweep never accumulates rounding error; leaving the context copies the snapshot back,
bit-exactly, also on error (the same pattern as :mod:`mechkit.interventions.weights`).

**Which base.** A vector extracted from base A and applied to a model B is a user error unless they
ask for it: every path here (:func:`apply`, :func:`save_merged`, :func:`arithmetic`, so also
``mechkit taskvec apply`` and ``taskvec sweep``) refuses a vector whose recorded base differs from
the model (architecture fields, then the weights' sha256 when the model is in the dtype the base was
hashed in; see :mod:`mechkit.taskarith.checks`), and vectors of different bases in one call, with
one line naming both. ``allow_other_base=True`` (``--allow-other-base``) applies it anyway; the
tensor names and shapes must still fit. λ must be finite, and weights that would come out NaN or
inf (a λ too large for the dtype) are refused before any is set; :func:`save_merged` also refuses a
model holding NaN or inf before it writes anything.

>>> import mechkit as mk, torch
>>> from mechkit.taskarith import TaskVector, apply
>>> m = mk.load_model("tiny:llama")
>>> tv = TaskVector({"model.norm.weight": torch.ones(64)})
>>> with apply(m, tv, scale=0.5):
...     m.model.model.norm.weight[0].item()
1.5
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError
from mechkit.interventions.weights import WeightEdits
from mechkit.io import check_out
from mechkit.io.atomic import umask_modes
from mechkit.io.replace import replacing_dir
from mechkit.model.edit.surgery import save_model_files, saved_config
from mechkit.model.names import checkpoint_renamer
from mechkit.model.placement.stored import StateView, state_items
from mechkit.taskarith.checks import (
    architecture,
    base_label,
    base_mismatch,
    finite_number,
    non_finite,
    refuse_non_finite,
)
from mechkit.taskarith.vector import TaskVector, check_compatible

if TYPE_CHECKING:
    from torch import nn

    from mechkit.model.handle import ModelHandle

Term = tuple[TaskVector, float]


def model_base(handle: ModelHandle, sha256: bool = True) -> dict:
    """The model's identity in the form a task vector records its base (``meta["base"]``)."""
    base = {"spec": handle.spec, "name": handle.name, "dtype": str(handle.dtype).removeprefix("torch."),
            "architecture": architecture(saved_config(handle.model))}
    if sha256:
        from mechkit.model.placement.stored import state_items
        from mechkit.taskarith.probe import weights_probe

        base["sha256"] = handle.weights_sha256()
        params = dict(handle.model.named_parameters())
        base["probe"] = weights_probe((n, t) for n, t in state_items(handle.model) if n in params)
    return base


class TaskArithmetic:
    """Sets a handle's weights to Ψ0 + Σ λ_i τ_i; :meth:`restore` puts Ψ0 back bit-exactly.

    Vectors whose recorded base is not this model are refused unless ``allow_other_base``.
    """

    def __init__(self, handle: ModelHandle, allow_other_base: bool = False) -> None:
        self.handle = handle
        self.allow_other_base = allow_other_base
        # names, shapes and dtypes only: a weight accelerate offloaded is a meta parameter here, edited
        # (and read) through self._edits wherever it lives
        self._params = dict(handle.model.named_parameters())
        self._edits = WeightEdits(handle)  # the snapshots Ψ0, restored bit-exactly
        self._touched: set[str] = set()
        self._rename = checkpoint_renamer(handle.model)
        self._base: dict | None = None  # model_base(handle), once a vector needs it

    def _model_base(self) -> dict:
        """This model's identity; its sha256 is taken of Ψ0, so edited weights are put back first."""
        if self._base is None:
            self._edits.reset()
            self._base = model_base(self.handle)
        return self._base

    def check_base(self, tv: TaskVector) -> None:
        """Raise unless ``tv`` was extracted from this model (or ``allow_other_base`` is set)."""
        base = tv.meta.get("base")
        if self.allow_other_base or not base:
            return
        reason = base_mismatch(base, self._model_base())
        if reason is not None:  # tensors this model cannot take: allow_other_base would fail on them next
            misfit = self._misfit(tv)
            fix = (f"apply it to the base it was extracted from (this model cannot take it: {misfit})" if misfit else
                   "apply it to the base it was extracted from, or pass --allow-other-base "
                   "(allow_other_base=True) to apply it anyway")
            raise MechkitError(f"{tv.describe()} was extracted from {base_label(base)}, not from this model "
                               f"{base_label(self._model_base())} ({reason})", fix)

    def _misfit(self, tv: TaskVector) -> str | None:
        """The first tensor of ``tv`` this model cannot take (a name it lacks, another shape), or None: what
        decides whether ``allow_other_base`` can help (tiny:llama's vectors fit tiny:qwen2; a pruned model's
        never fit the dense one)."""
        for name, delta in tv.deltas.items():
            param = self._params.get(name if name in self._params else self._rename(name))
            if param is None:
                return f"it has no parameter {name}"
            if delta.shape[0] > param.shape[0] or delta.shape[1:] != param.shape[1:]:
                return f"{name} is {tuple(param.shape)} here, {tuple(delta.shape)} in the vector"
        return None

    def _name(self, name: str) -> str:
        """The module parameter a vector's tensor name means (checkpoint names such as GPT-NeoX's
        ``embed_out.weight`` are renamed as transformers renames them when loading)."""
        if name in self._params:
            return name
        renamed = self._rename(name)
        if renamed not in self._params:
            raise MechkitError(f"the task vector names a parameter the model lacks: {name}",
                               "apply a task vector extracted from this model's architecture")
        return renamed

    def _param(self, name: str) -> nn.Parameter:
        name = self._name(name)
        self._touched.add(name)
        self._edits.slot(name)  # snapshot Ψ0 before anything changes
        return self._params[name]

    @torch.no_grad()
    def set(self, *terms: Term) -> None:
        """Weights := Ψ0 + Σ λ τ over ``(vector, λ)`` terms; parameters no term touches go back to Ψ0.

        Everything is checked before any weight changes: finite λ, the vectors' bases (see the module
        docstring), tensor names and shapes, and that no resulting weight is NaN or inf.
        """
        terms = tuple((tv, finite_number(lam, f"λ for {tv.describe()}", "λ = 0.5")) for tv, lam in terms)
        if not self.allow_other_base:
            check_compatible([tv for tv, _ in terms], shapes=False)  # each is fitted to the model below
            for tv, _ in terms:
                self.check_base(tv)
        for tv, _ in terms:
            for name, delta in tv.deltas.items():
                p = self._param(name)
                if delta.shape[0] > p.shape[0] or delta.shape[1:] != p.shape[1:]:
                    raise MechkitError(f"task vector tensor {name} has shape {tuple(delta.shape)}, "
                                       f"the model's {tuple(p.shape)}", "extract the vector from this base model")
        sums: dict[str, torch.Tensor] = {}  # Ψ0 + Σ λ τ in at least float32, rounded into the weight's dtype once
        for tv, lam in terms:
            if lam == 0:
                continue
            for name, delta in tv.deltas.items():
                key = self._name(name)
                if key not in sums:
                    base = self._edits.original(key)
                    sums[key] = base.to(torch.promote_types(base.dtype, torch.float32), copy=True)
                acc = sums[key]
                acc[:delta.shape[0]] += delta.to(device=acc.device, dtype=torch.float32).to(acc.dtype) * lam
        rounded = {key: acc.to(self._params[key].dtype) for key, acc in sums.items()}
        bad = non_finite(rounded)
        if bad is not None:
            raise MechkitError(f"Ψ0 + Σ λ·τ has {bad[1]} values in {bad[0]} "
                               f"(λ {', '.join(f'{lam:g}' for _, lam in terms)})",
                               "lower λ or the vector's scale, or check the vectors for a diverged fine-tune")
        for name in self._touched:
            self._edits.named(name).copy_(rounded[name] if name in rounded else self._edits.original(name))

    def restore(self) -> None:
        self._edits.restore()
        self._touched.clear()


@contextlib.contextmanager
def arithmetic(handle: ModelHandle, allow_other_base: bool = False) -> Iterator[TaskArithmetic]:
    """A :class:`TaskArithmetic` for the duration of the context (restored on exit, also on error)."""
    ta = TaskArithmetic(handle, allow_other_base=allow_other_base)
    try:
        yield ta
    finally:
        ta.restore()


@contextlib.contextmanager
def apply(handle: ModelHandle, vector: TaskVector | Sequence[Term], scale: float = 1.0,
          allow_other_base: bool = False) -> Iterator[ModelHandle]:
    """Ψ0 + scale·τ (or Ψ0 + Σ λ_i τ_i for a list of terms) inside the context; Ψ0 after it."""
    terms = [(vector, scale)] if isinstance(vector, TaskVector) else list(vector)
    with arithmetic(handle, allow_other_base=allow_other_base) as ta:
        ta.set(*terms)
        yield handle


def save_merged(handle: ModelHandle, vector: TaskVector | Sequence[Term], out_dir: str | Path,
                scale: float = 1.0, force: bool = False, allow_other_base: bool = False) -> Path:
    """Write Ψ0 + scale·τ as a loadable model directory (safetensors, config, tokenizer), atomically.

    ``out_dir`` may be new or an empty directory; in a non-empty one (only with ``force``) the files a
    model directory holds are replaced as one set and the user's other files kept
    (:func:`mechkit.io.replace.replacing_dir`). The directory is locked while it is written.
    Nothing is written when the vector's base is not this model (unless ``allow_other_base``) or
    when a merged weight is NaN or inf.
    """
    from mechkit.io.outlock import out_lock

    inputs = (handle.source,) if isinstance(handle.source, Path) else ()
    out = check_out(out_dir, force, kind="dir", inputs=inputs)
    with out_lock(out), apply(handle, vector, scale, allow_other_base=allow_other_base):
        check_out(out, force, kind="dir")  # again under the lock: another writer may have finished meanwhile
        refuse_non_finite(StateView(handle.model), out / "model.safetensors",
                          "lower λ or the vector's scale, or check the base model's weights")
        with replacing_dir(out, writer="taskvec apply", force=force) as tmp:  # only its own files replaced, as one set
            with warnings.catch_warnings():  # transformers' note that an offloaded model is read back to save it
                warnings.filterwarnings("ignore", message="Attempting to save a model with offloaded modules")
                save_model_files(handle.model, tmp, **_offloaded_state(handle.model))  # a pruned one's config too
            if handle.tokenizer is not None:
                handle.tokenizer.save_pretrained(tmp)
            umask_modes(tmp)  # also where --force installs the files into an existing directory
    return out


def _offloaded_state(model: nn.Module) -> dict:
    """``save_pretrained``'s ``state_dict`` where it would meet offloaded (meta) weights it cannot find itself.

    transformers reads disk/CPU-offloaded weights back through accelerate's hooks when the model has
    a device map saying so; a model offloaded by other means (``accelerate.cpu_offload``) gets its
    weights, edits included, from :func:`mechkit.model.placement.stored.state_items`.
    """
    placed = getattr(model, "hf_device_map", None) or {}
    if not any(p.device.type == "meta" for p in model.parameters()) or {"cpu", "disk"} & set(placed.values()):
        return {}
    return {"state_dict": dict(state_items(model))}


__all__ = ["TaskArithmetic", "apply", "arithmetic", "model_base", "save_merged"]
