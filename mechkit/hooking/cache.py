"""What :func:`mechkit.record` hands back: recorded activations by hook name, a mapping of tensors.

A name recorded on several forwards inside one context holds one part per forward, joined on batch when
read (``cache[name]``). The parts live in a private dict; every mapping operation (``in``, ``len``,
iteration, ``dict(cache)``, ``{**cache}``, ``items``, ``pop``, ``==``, copies, pickling) is derived from
``__getitem__``/``__setitem__``/``__delitem__`` (:class:`collections.abc.MutableMapping`), so none hands
out the raw parts. (It was a ``dict`` subclass: each dict method that read the parts directly had to be
overridden, one failure at a time.) A Cache is a :class:`~collections.abc.Mapping`, not a ``dict``.

>>> import mechkit as mk
>>> m = mk.load_model("tiny:llama")
>>> with mk.record(m, "blocks.0.hook_resid_post") as cache:
...     _ = m(m.to_tokens("hello"))
...     _ = m(m.to_tokens("world"))
>>> cache["blocks.0.hook_resid_post"].shape[0], list(cache), "blocks.1.hook_resid_post" in cache
(2, ['blocks.0.hook_resid_post'], False)
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, MutableMapping, ValuesView
from typing import TYPE_CHECKING, Any

import torch

from mechkit.errors import MechkitError
from mechkit.hooking.points import all_names, canonical, resolve

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


class NotRecorded(MechkitError, KeyError):
    """A hook name a :class:`Cache` does not hold."""

    __str__ = MechkitError.__str__  # KeyError's would quote the line


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):  # values a user stored whose == is no single answer (arrays)
        return False


class _Values(ValuesView):
    """A Cache's values, whose ``in`` finds a tensor by identity or by shape, dtype and values."""

    def __contains__(self, value: object) -> bool:
        return any(v is value or _same_value(v, value) for v in self)


def _described(parts: list) -> str:
    """One recorded name's shape and dtype for the repr; what a user stored that is no tensor, by its type (a
    ``cache.setdefault(name)`` stores None)."""
    if not all(isinstance(p, torch.Tensor) and p.ndim for p in parts):
        return type(parts[0]).__name__ if len(parts) == 1 else f"{len(parts)} parts"
    if len({(tuple(p.shape[1:]), p.dtype, p.device) for p in parts}) > 1:  # the first part's shape named a join
        return f"{len(parts)} parts that cannot be joined"                      # that reading refuses
    shape = [sum(p.shape[0] for p in parts), *parts[0].shape[1:]]
    return f"{shape} {str(parts[0].dtype).removeprefix('torch.')}"


def _lacks(missing: list[str]) -> str:
    return f"this recording lacks {missing[0]}{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}"


def _points(handle: ModelHandle, pattern: str) -> list:
    try:
        return resolve(handle.anatomy, pattern)
    except MechkitError:  # a point this family lacks (resid_mid of a parallel block, a norm-less model)
        return []


MARK_TOKENS, MARK_POSITIONS = 128, 64  # logits kept per recorded row: evenly spaced token ids at evenly spaced positions


SHAPING = ("logits_to_keep", "num_logits_to_keep")  # forward arguments that choose which logits come back


def shaping_of(kwargs: dict) -> dict:
    """The arguments of a recorded forward that shape its output (which positions get logits), kept to replay
    it with them: replayed without, ``m(ids, logits_to_keep=1)`` gave every position's logits, and a completion
    read the other shape as "the model now gives other logits"."""
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()
            if k in SHAPING and v is not None}


def logit_mark(output: Any, model: Any = None, hidden: Any = None) -> tuple[torch.Tensor, tuple[str, ...]] | None:
    """A forward's logits in brief: each row's logits at :data:`MARK_TOKENS` evenly spaced token ids, at every
    position (evenly spaced :data:`MARK_POSITIONS` of a longer row, the first and last among them), as float32,
    then its precision's tolerance (:func:`_same_mark`); and what it ran in: the logits' dtype and device and
    the weights' dtype (``model``'s). Enough to tell that a forward recorded again is the recorded one, at most
    32 KB per row kept (``None``: no logits). Every position, not the last alone: an intervention at an earlier
    position of the last block moves only that position's logits.

    A forward whose logits were cut (``logits_to_keep=1``: fewer positions than ``hidden``, the final hidden state
    :func:`final_hidden` kept) is marked by that hidden state instead, at every position sampled the same way,
    each position seen through :data:`MARK_TOKENS` fixed directions (:func:`_directions`): the kept logits alone
    missed an intervention at any other position, and its activations were completed from the unhooked model."""
    logits = getattr(output, "logits", output)
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3 or logits.is_meta or not logits.is_floating_point():
        return None
    rows, length, vocab = logits.shape
    where = logits.device
    cut = isinstance(hidden, torch.Tensor) and hidden.ndim == 3 and hidden.shape[0] == rows \
        and hidden.shape[1] != length and not hidden.is_meta and hidden.is_floating_point()
    seen = hidden.detach() if cut else logits.detach()
    length = seen.shape[1]
    positions = torch.linspace(0, length - 1, min(MARK_POSITIONS, length), device=seen.device).round().long()
    if cut:
        picked = (seen[:, positions].float() @ _directions(seen.shape[-1], seen.device)).reshape(rows, -1).to(where)
    else:
        tokens = torch.linspace(0, vocab - 1, min(MARK_TOKENS, vocab), device=where).round().long()
        picked = seen[:, positions][:, :, tokens].reshape(rows, -1)
    weights = getattr(model, "dtype", None)
    weights = weights if isinstance(weights, torch.dtype) and weights.is_floating_point else logits.dtype
    bits = min(torch.finfo(logits.dtype).bits, torch.finfo(weights).bits,  # logits upcast from half weights: half's
               torch.finfo(seen.dtype).bits)
    tol = 1e-4 if bits >= 32 else 5e-3
    # kept on the logits' device: every recorded forward makes one, and a .cpu() here was a device sync per
    # forward in every analysis that records; only a completion (rare) compares them, on the CPU
    kind = (str(logits.dtype).removeprefix("torch."), str(where), str(weights).removeprefix("torch."))
    return torch.cat([picked.float(), torch.full((rows, 1), tol, device=where)], dim=1), kind


_DIRECTIONS: dict[tuple[int, str], torch.Tensor] = {}


def _directions(width: int, device: torch.device) -> torch.Tensor:
    """:data:`MARK_TOKENS` fixed directions in a hidden state of ``width`` (seeded, so the same in every forward
    and process; made once per width and device): each mixes every feature, as an unembedding row does, so a
    change of any one feature moves them, where sampling features would have seen only those sampled."""
    key = (width, str(device))
    if key not in _DIRECTIONS:
        _DIRECTIONS[key] = torch.randn(width, MARK_TOKENS, generator=torch.Generator().manual_seed(0)).to(device)
    return _DIRECTIONS[key]


@contextlib.contextmanager
def final_hidden(handle: ModelHandle) -> Iterator[list]:
    """While open, a list holding the final hidden state of the latest forward of ``handle`` at every position
    (the final norm's output; the last block's where the model has none), for :func:`logit_mark` to mark a
    forward whose logits were cut. Cleared as each forward starts: a forward that never reaches it has none."""
    kept: list = []
    a = handle.anatomy
    module = a.final_norm if a.final_norm is not None else a.block(a.n_layers - 1) if a.n_layers else None

    def start(*_args: Any) -> None:
        kept.clear()

    def post(_module: Any, _args: Any, output: Any) -> None:
        value = output[0] if isinstance(output, tuple | list) else output
        kept[:] = [value.detach()] if isinstance(value, torch.Tensor) else []

    removers = [handle.model.register_forward_pre_hook(start)]
    if module is not None:
        removers.append(module.register_forward_hook(post))
    try:
        yield kept
    finally:
        for remover in removers:
            remover.remove()


def _kind(mark: Any) -> tuple[str, ...] | None:
    """What a mark's forward ran in (``None``: a mark pickled before marks said so)."""
    return mark[1] if isinstance(mark, tuple) else None


def _described_kind(kind: tuple[str, ...]) -> str:
    logits, device, weights = kind
    return f"{logits} on {device}" + (f" (weights in {weights})" if weights != logits else "")


def _same_mark(a: Any, b: Any) -> bool:
    """Whether two marks are one forward's: within the recording's tolerance, 0.01% of the row's largest logit
    kept in float32, 0.5% in half precision (the forward again runs the same kernels, so a difference is the
    device's rounding order). The recording's, not the larger of the two: a model cast to bfloat16 since passed
    with bfloat16's 0.5%, and its activations were completed next to the float32 ones recorded (a forward in
    another dtype or on another device is refused before: :meth:`Cache._complete`). An intervention that moves
    every logit kept by less than that is not told apart (backends.md says so)."""
    a, b = (m[0] if isinstance(m, tuple) else m for m in (a, b))
    if b is None or a.shape != b.shape:
        return False
    a, b = a.cpu(), b.cpu()
    tol = a[:, -1] * a[:, :-1].abs().amax(dim=1).clamp(min=1.0)
    return bool(((a[:, :-1] - b[:, :-1]).abs().amax(dim=1) <= tol).all())


class Cache(MutableMapping):
    """Recorded activations by hook name; several forwards inside one context are concatenated on batch.

    ``Cache({name: tensor})`` builds one by hand (each value is one part, read back as it was stored).
    """

    handle: ModelHandle | None = None  # the model recorded (set by :func:`mechkit.record`)
    continued: bool = False  # a recorded forward's ids alone do not replay it (generate, padding): :meth:`completion`
    inputs: list | None = None  # the token ids of each recorded forward (native backend), for completing it
    marks: list | None = None  # each recorded forward's logits in brief (:func:`logit_mark`): a completion's must match
    shaping: list | None = None  # each recorded forward's output-shaping arguments (:func:`shaping_of`), replayed
    foreign: str | None = None  # the first point set by hand or merged from another recording: not completable
    _parts: dict[str, list]  # each name's parts, one per forward (set in __new__)

    def __new__(cls, *_args: Any, **_kwargs: Any) -> Cache:
        # Here, not in __init__: unpickling does not call __init__, and a cache pickled while Cache was a dict
        # subclass stores its names (through __setitem__) before its attributes.
        self = super().__new__(cls)
        self._parts = {}
        return self

    def __init__(self, other: Any = (), /, **more: Any) -> None:
        self.update(other, **more)

    def append(self, name: str, value: Any) -> None:
        """One more forward's activation at ``name``, joined on batch with the earlier ones when read."""
        if name not in self:  # (an unhashable name is simply not there, and refused by _store)
            self._store(name, value)  # the recording's own: not "set by hand" (__setitem__)
            return
        self._parts[name].append(value)

    def _store(self, name: str, value: Any) -> None:
        try:
            self._parts[name] = [value]
        except TypeError:  # an unhashable name (a list): one line, as reading or deleting it says
            raise MechkitError(f"a cache is keyed by hook names; {name!r} cannot be one"[:200],
                               "store under a hook name (a string), e.g. cache[\"blocks.0.hook_resid_post\"] = t") from None

    @classmethod
    def fromkeys(cls, names: Any, value: Any = None) -> Cache:
        """A Cache of ``names``, each holding ``value`` (as ``dict.fromkeys``: Cache was a dict once)."""
        return cls((name, value) for name in names)

    # The five methods every other mapping operation is derived from.
    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            parts = self._parts.get(name)
        except TypeError:  # an unhashable key (a list): not recorded either
            parts = None
        if parts is None:
            raise self._not_recorded(name)
        if len(parts) == 1:
            return parts[0]
        if not all(isinstance(p, torch.Tensor) and p.ndim for p in parts):  # cache.append(name, 5): no batch
            kinds = ", ".join(f"{type(p).__name__}{'' if not isinstance(p, torch.Tensor) else ' of 0 dimensions'}"
                              for p in parts if not (isinstance(p, torch.Tensor) and p.ndim))
            raise MechkitError(f"{name} holds {len(parts)} parts to be joined on batch, and not all are tensors with "
                               f"a batch dimension ({kinds})"[:300],
                               "append only [batch, ...] tensors to a name (cache.append(name, t)), or store one "
                               "value with cache[name] = value")
        shapes = {tuple(p.shape[1:]) for p in parts}
        if len(shapes) > 1:  # forwards of different lengths: torch.cat's raw RuntimeError otherwise
            raise MechkitError(f"{name} was recorded on {len(parts)} forwards of different shapes "
                               f"({', '.join(str(list(p.shape)) for p in parts[:3])}): they cannot be joined on batch",
                               "record the forwards of each length each in its own mk.record")
        devices = {p.device for p in parts}
        if len(devices) > 1:  # torch.cat's raw "Tensor on device meta is not on the expected device" otherwise
            raise MechkitError(f"{name} holds {len(parts)} parts on different devices ({', '.join(sorted(map(str, devices)))}): "
                               "they cannot be joined on batch", "append tensors on one device to a name "
                               "(cache.append(name, t.to(device)))")
        return torch.cat(parts, dim=0)

    def __setitem__(self, name: str, value: Any) -> None:
        """``value`` is one part: a tensor stored is read back whole (batch dimension kept). Stored in a recording
        (one with a model), it is no activation of the recorded forwards that the recording can vouch for: the
        cache is then no longer completable (:attr:`foreign`), or a completion would have set the points it
        records again on those forwards next to it (reading what it holds is unchanged)."""
        held = self._parts.get(name) if isinstance(name, str) else None
        self._store(name, value)
        if self.handle is not None and self.foreign is None and not (held is not None and len(held) == 1
                                                                     and held[0] is value):  # c[n] = c[n]: the same
            self.foreign = str(name)

    def update(self, other: Any = (), /, **more: Any) -> None:
        """As a dict updates. Another recording's cache of the same model, token ids and logits (the same
        forwards recorded twice) is merged as part of this recording, its parts as they were; anything else
        stored in a recording (another recording's points, a plain dict's) makes it not completable
        (:meth:`__setitem__`): ``c1 | c2`` of two inputs was completed on ``c1``'s ids alone, silently."""
        if isinstance(other, Cache) and other is not self and self.handle is not None and self._same_recording(other):
            for name, parts in other._parts.items():
                self._parts[name] = list(parts)
            self.continued = self.continued or other.continued
            self.foreign = self.foreign or other.foreign
            other = ()
        super().update(other, **more)

    def _same_recording(self, other: Cache) -> bool:
        """Whether ``other`` recorded the forwards this cache recorded: the same model (one handle), the same
        token ids of each forward (``torch.equal``), output shaping and logits (:func:`_same_mark`, both
        kept on the native backend; a traced backend keeps none, so nothing tells)."""
        if other.handle is not self.handle or self.inputs is None or other.inputs is None:
            return False
        if len(self.inputs) != len(other.inputs) or not all(
                a.shape == b.shape and bool(torch.equal(a.cpu(), b.cpu())) for a, b in zip(self.inputs, other.inputs, strict=True)):
            return False
        mine, theirs = self.marks or [None] * len(self.inputs), other.marks or [None] * len(other.inputs)
        if len(mine) != len(theirs) or any((a is None) != (b is None) or (a is not None and (
                _kind(a) != _kind(b) or not _same_mark(a, b))) for a, b in zip(mine, theirs, strict=True)):
            return False
        mine, theirs = self.shaping or [{}] * len(self.inputs), other.shaping or [{}] * len(other.inputs)
        return len(mine) == len(theirs) and all(a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
                                                for a, b in zip(mine, theirs, strict=True))

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise self._not_recorded(name)
        del self._parts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def _not_recorded(self, name: Any) -> NotRecorded:
        """A name not recorded: one line naming what was (a ``KeyError`` too, so ``except KeyError`` holds)."""
        shown = ", ".join(list(self)[:4]) + (f" and {len(self) - 4} more" if len(self) > 4 else "")
        return NotRecorded(f"{name!r} was not recorded; this cache holds {shown or 'nothing'}"[:300],
                           "record it: mk.record(m, [\"blocks.0.hook_resid_post\", ...]) names what is kept "
                           "(full names, as list(cache) shows them)")

    # Where the mixin's way is wrong or wasteful for tensors.
    def __contains__(self, name: object) -> bool:  # the mixin reads (joins) the value to find out
        try:
            return name in self._parts
        except TypeError:  # an unhashable key (a list) is simply not there, as in a dict
            return False

    def values(self) -> ValuesView:
        """The joined tensors; ``t in cache.values()`` compares as :meth:`__eq__` does (the mixin's ``==`` on a
        tensor raised torch's "Boolean value of Tensor ... is ambiguous")."""
        return _Values(self)

    def __reversed__(self) -> Iterator[str]:
        return reversed(self._parts)

    def popitem(self) -> tuple[str, Any]:
        """The last name and its value (as a dict pops; the mixin would take the first)."""
        if not self._parts:
            raise NotRecorded("popitem(): this cache is empty, nothing to pop",
                              "check len(cache) first, or record something: mk.record(m, names)")
        name = next(reversed(self._parts))
        return name, self.pop(name)

    def clear(self) -> None:
        self._parts.clear()

    def __eq__(self, other: object) -> bool:
        """The same names holding equal values (tensors of one shape, dtype and values), as a dict of the joined
        tensors compares (the mixin's ``dict(self.items()) == dict(other.items())`` raised torch's "Boolean
        value of Tensor ... is ambiguous")."""
        if not isinstance(other, Mapping):
            return NotImplemented
        if set(self.keys()) != set(other.keys()):
            return False
        return all(_same_value(self[name], other[name]) for name in self)

    __hash__ = None  # type: ignore[assignment]  (mutable: not hashable)

    # dict's own extras, kept.
    def copy(self) -> Cache:
        """A Cache of the same recording (the same tensors, model and inputs)."""
        new = type(self)()
        new._parts = {name: list(parts) for name, parts in self._parts.items()}
        new.handle, new.inputs, new.continued, new.marks = self.handle, self.inputs, self.continued, self.marks
        new.shaping, new.foreign = self.shaping, self.foreign
        return new

    __copy__ = copy  # copy.copy would share the parts dict

    def __deepcopy__(self, memo: dict) -> Cache:
        """Copies of the tensors; the recorded model is referred to, not copied (a copy of its weights)."""
        new = self.copy()
        new._parts = copy.deepcopy(self._parts, memo)
        new.inputs, new.shaping = copy.deepcopy(self.inputs, memo), copy.deepcopy(self.shaping, memo)
        return new

    def __getstate__(self) -> dict:
        """What pickling keeps: the parts, the inputs and the recorded model (see the module doc). A model
        served through another backend (nnsight, NDIF) cannot be pickled: one line, not the raw
        "Can't pickle local object" from inside it."""
        backend = getattr(getattr(self.handle, "backend", None), "name", "native")
        if self.handle is not None and backend != "native":
            raise MechkitError(f"this recording's model runs through the {backend} backend, which cannot be pickled "
                               "with the cache", "pickle dict(cache) (its tensors, by hook name) instead")
        return self.__dict__.copy()

    def __or__(self, other: Any) -> Cache:
        if not isinstance(other, Mapping):
            return NotImplemented
        new = self.copy()
        new.update(other)
        return new

    def __ror__(self, other: Any) -> dict:
        """``{...} | cache``: a dict (the left operand's type, as for dicts), of tensors."""
        if not isinstance(other, Mapping):
            return NotImplemented
        return {**other, **self}

    def __ior__(self, other: Any) -> Cache:
        self.update(other)
        return self

    def to_transformer_lens(self, model: Any = None) -> Any:
        """This recording as a TransformerLens ``ActivationCache`` (the same names; ``model`` defaults to a
        ``TransformerBridge`` over the recorded model): see :mod:`mechkit.hooking.transformer_lens`."""
        from mechkit.hooking.transformer_lens import TL_NEEDS, activation_cache

        # what TL's tools read and this recording lacks is recorded again, or refused where it cannot be (a
        # recording through nnsight, of inputs_embeds): dropped, TL's accumulated_resid KeyErrored inside TL. A
        # cache built by hand knows no model, hence no family to say what it lacks: it converts as it is. Through
        # a traced backend, a point it cannot record at all (hook_resid_mid, ln_final.hook_scale) is left out as
        # a point the family lacks is: refused, no nnsight recording could ever be converted.
        if self.handle is None:
            return activation_cache(self, model, extra={})
        return activation_cache(self, model, extra=self._complete(TL_NEEDS, servable=True))

    def completion(self, patterns: str | tuple[str, ...] | list[str]) -> dict:
        """The points matching ``patterns`` this recording lacks, recorded again on its forwards' token
        ids (one more forward per recorded one, only when something is missing). A pattern that matches no
        hook point of the model (a typo, a layer past the last) is refused, as ``run_with_cache`` refuses it:
        it came back as ``{}``, which reads as "nothing was missing". So is a missing point of a recording that
        cannot be run again (through nnsight, of ``inputs_embeds``): ``{}`` means nothing is missing."""
        if self.handle is not None:
            for pattern in [patterns] if isinstance(patterns, str) else patterns if isinstance(
                    patterns, list | tuple | set | frozenset) else ():
                if isinstance(pattern, str):
                    resolve(self.handle.anatomy, pattern)  # its own one line: "no hook point matches …"
            if self.foreign is not None and not self._complete(patterns, check=True):
                # nothing lacking, yet {} would read "these points are one forward's": they are not known to be
                raise self._not_completable(None)
        return self._complete(patterns)

    def _not_completable(self, lacks: str | None) -> MechkitError:
        """The one line refusing a completion of a cache some of whose points were stored by hand or merged from
        another recording (:attr:`foreign`): recorded again on this cache's forwards, the points it lacks would
        sit next to activations of other inputs (or of none)."""
        why = ("recorded again on its own forwards they would be another forward's activations" if lacks else
               "a completion cannot tell that what it holds is one forward's (nothing is missing)")
        return MechkitError(f"{lacks + ', and p' if lacks else 'P'}oints of this cache were set by hand or merged from "
                            f"another recording (first {self.foreign}): {why}", "record every point needed in one run (mk.record(m, [...]) "
                            "naming them all, or mk.record(m, \"*\")); read what it holds as it is")

    def _complete(self, patterns: Any, servable: bool = False, check: bool = False) -> Any:
        """:meth:`completion` without the check that each pattern matches: TransformerLens' needs name points
        a family may lack (the resid_mid of a parallel block), which are simply not recorded. What is missing
        is found first, and ``{}`` comes back only when nothing is: a recording that cannot be run again (through
        a traced backend, of ``inputs_embeds``, with no model) came back as ``{}`` too, which read as complete.
        ``check``: only the names missing (nothing is run or refused past that)."""
        if isinstance(patterns, str):  # one pattern, not its letters
            patterns = (patterns,)
        if not isinstance(patterns, list | tuple | set | frozenset) or not all(isinstance(p, str) for p in patterns):
            raise MechkitError(f"Cache.completion takes a hook name pattern or a list of them, not {patterns!r}",
                               'pass e.g. "blocks.*.attn.hook_z" or ["blocks.0.hook_resid_post"]')
        handle, inputs = self.handle, self.inputs
        if handle is None:  # no model: a pattern cannot be resolved, a full name not held is missing all the same
            missing = [p for p in patterns if "*" not in p and p not in self and canonical(p) not in self]
            if missing:
                raise MechkitError(f"{_lacks(missing)}, and this cache knows no model (built by hand, or its model "
                                   "was not recorded with it): nothing can be recorded again",
                                   "record every point needed with mk.record(m, names) on the model")
            return {}
        have = set(all_names(handle.anatomy))
        lacked = {p.name: p for pattern in patterns for p in _points(handle, pattern)
                  if p.name in have and p.name not in self}
        if servable and handle.backend.traced:  # only what the backend records at all counts as lacking
            from mechkit.hooking.traced import ORDER

            lacked = {name: p for name, p in lacked.items() if p.suffix in ORDER}
        missing = list(lacked)
        if check:
            return missing
        if not missing:
            return {}
        lacks = _lacks(missing)
        if self.foreign is not None:
            raise self._not_completable(lacks)
        if handle.backend.traced:  # its forwards ran inside traces: no token ids were kept to run them again
            from mechkit.hooking.traced import ORDER

            backend = getattr(handle.backend, "name", "nnsight")
            served = all(p.suffix in ORDER for p in lacked.values())  # else only the native backend records them
            raise MechkitError(f"{lacks}, and it was recorded through the {backend} backend, which keeps no token "
                               "ids to record it again", ("record every point needed in that run (mk.run_with_cache(m, "
                               "ids) with no names records all it serves), or " if served else "") +
                               "record on the native backend (mk.load_model(name)), whose recordings complete")
        if self.continued:  # recorded again without the KV cache, they would silently be other activations
            raise MechkitError(f"{lacks}, and its forwards continued a KV cache (model.generate), masked padding, set "
                               "their own positions or took other inputs than token ids: recorded again on their "
                               "token ids alone they would be other activations", "record every point needed in that "
                               "run (mk.record(m, \"*\")), or record the token ids in one unpadded forward")
        if not inputs:  # no forward of the whole model while it recorded (a block called alone), or built by hand
            raise MechkitError(f"{lacks}, and it kept no token ids of its forwards (none ran through the whole model "
                               "while it recorded): nothing can be run again", "record every point needed in that "
                               "run (mk.record(m, \"*\")), running the model itself (m(ids)) inside it")
        lengths = sorted({ids.shape[-1] for ids in inputs})
        if len(lengths) > 1:  # the points recorded again could not be joined on batch; padding would not replay
            raise MechkitError(f"{lacks}, and its forwards have different lengths ({', '.join(map(str, lengths[:4]))}): "
                               "the points recorded again on them cannot be joined on batch",
                               "record the forwards of each length each in its own mk.record and complete each, or "
                               "record every point needed in that run (mk.record(m, \"*\"))")
        from mechkit.hooking import record  # the package's, not core's: core imports this module

        # First the recorded forwards again, recording what they recorded (the same attention kernel: recording a
        # pattern runs eager attention), to see that the model still gives the logits it gave then.
        witness = [name for name in self if name in have]
        shaping = self.shaping if self.shaping and len(self.shaping) == len(inputs) else [{}] * len(inputs)
        now = []
        with torch.no_grad(), (record(handle, witness) if witness else contextlib.nullcontext()), \
                final_hidden(handle) as hidden:
            for ids, kwargs in zip(inputs, shaping, strict=True):
                out = handle(ids, **kwargs)
                now.append(logit_mark(out, handle.model, hidden[0] if hidden else None))
        marks = self.marks or [None] * len(inputs)
        for mark, mine in zip(marks, now, strict=False):
            if _kind(mark) is not None and mine is not None and _kind(mark) != _kind(mine):
                # another precision's or device's activations next to the recorded ones: within its looser
                # tolerance the logits passed, and the completed points were silently of another forward
                raise MechkitError(f"{lacks}, and it recorded in {_described_kind(_kind(mark))} but the model now "
                                   f"runs in {_described_kind(_kind(mine))}: recorded again they would be another "
                                   "precision's or device's activations", "complete it before changing the model's dtype or "
                                   "device (a cast back from a lower precision does not restore the weights), or "
                                   "record every point needed in that run (mk.record(m, \"*\"))")
        if any(mark is not None and not _same_mark(mark, mine) for mark, mine in zip(marks, now, strict=False)):
            # hooks, an ablation or a weight edit were open while it recorded (or are now): the model's forward
            # then is not its forward now, and the points recorded again would mix two models
            raise MechkitError(f"{lacks}, and the model now gives other logits on its forwards than while it "
                               "recorded (hooks, mk.ablate or a weight edit were open then, or are now): recorded "
                               "again they would be another forward's activations",
                               "record every point needed in that run (mk.record(m, \"*\")), or complete it "
                               "inside the same hooks and edits")
        with torch.no_grad(), record(handle, missing) as again:
            for ids, kwargs in zip(inputs, shaping, strict=True):
                handle(ids, **kwargs)
        return dict(again)

    def __repr__(self) -> str:
        """The names with shapes and dtypes, a few lines (never the tensors): ``Cache of 2 hook points …``.

        >>> import mechkit as mk
        >>> m = mk.load_model("tiny:llama")
        >>> _, cache = mk.run_with_cache(m, m.to_tokens("hello"), "blocks.*.attn.hook_z")
        >>> print(repr(cache))                                 # doctest: +ELLIPSIS
        Cache of 2 hook points from tiny:llama, ... MB
          blocks.0.attn.hook_z  [1, ..., 4, 16] float32
          blocks.1.attn.hook_z  [1, ..., 4, 16] float32
        """
        shown, names = 8, [str(name) for name in self]  # a key stored by hand may be no string (an int)
        size = sum(t.numel() * t.element_size() for parts in self._parts.values() for t in parts
                   if isinstance(t, torch.Tensor))
        model = f" from {self.handle.spec}" if self.handle is not None else ""
        lines = [f"Cache of {len(names)} hook point{'s' if len(names) != 1 else ''}{model}, {size / 1e6:.3g} MB"]
        width = max((len(n) for n in names[:shown]), default=0)
        for name, parts in list(self._parts.items())[:shown]:
            lines.append(f"  {str(name):<{width}}  {_described(parts)}")
        if len(names) > shown:
            lines.append(f"  … {len(names) - shown} more (list(cache) names them all)")
        return "\n".join(lines)

    __str__ = __repr__
