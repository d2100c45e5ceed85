"""How a worker loads the same model the run loaded: the spec, dtype, device (or device map) and backend.

Taken from the run's :class:`~mechkit.model.handle.ModelHandle`, so it says how the model *is* placed,
whatever the options that placed it: a worker loads ``tiny:llama`` in float32 on its CPU, the embedded
model in bfloat16 on its own GPU, or a model accelerate spread over several GPUs spread the same way
over the GPUs Ray gave the worker. The worker then checks it holds the same weights (SHA-256), and
runs torch on as many threads as the run does: on CPUs a matrix product's rounding can depend on the
number of threads, and a report must not depend on where its units ran.

>>> import mechkit as mk
>>> spec = LoadSpec.of(mk.load_model("tiny:llama", device="cpu"))
>>> spec.spec, spec.dtype, spec.device, spec.gpus
('tiny:llama', 'float32', 'cpu', 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mechkit.errors import MechkitError

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle


@dataclass(frozen=True)
class LoadSpec:
    """The arguments of :func:`mechkit.load_model` that rebuild a run's model in another process."""

    spec: str
    dtype: str
    device: str  # "cpu" or "cuda" (a worker's first visible GPU); unused with a device map
    device_map: dict[str, str] | None = None  # {module: "cuda:N" | "cpu" | "disk"} of a dispatched model
    backend: str = "native"
    remote: str | None = None
    sha256: str | None = None
    threads: int = 1  # torch's intra-op threads: the run's, since CPU results can depend on their number

    @classmethod
    def of(cls, handle: ModelHandle) -> LoadSpec:
        """The load spec of a loaded model; one line where it cannot be rebuilt elsewhere (an object)."""
        if handle.backend.remote == "ndif":
            raise MechkitError("--executor ray with --remote ndif: the model runs on NDIF's servers, and Ray workers "
                               "would only send them the same jobs from more places", "leave out --executor ray")
        if handle.spec.startswith("<"):
            raise MechkitError(f"--executor ray loads the model in each worker, and {handle.spec} was handed in "
                               "as an object", "pass its name, directory or hub id as --model instead")
        return cls(spec=handle.spec, dtype=str(handle.dtype).removeprefix("torch."),
                   device="cuda" if handle.device.type == "cuda" else "cpu", device_map=handle.device_map,
                   backend=handle.backend.name, remote=handle.backend.remote, sha256=handle.weights_sha256(),
                   threads=_torch_threads())

    @property
    def gpus(self) -> int:
        """GPUs one worker needs: those the device map names, else one for a model on CUDA."""
        if self.device_map:
            return len(_cuda_indices(self.device_map))
        return 1 if self.device == "cuda" else 0

    def load(self, offload_folder: str | None = None) -> ModelHandle:
        """The model, loaded here; a device map's GPUs renumbered onto those this process sees."""
        from mechkit.model.loading import load_model

        device_map = _renumbered(self.device_map) if self.device_map else None
        if device_map and "disk" in device_map.values() and offload_folder is None:
            import tempfile

            offload_folder = tempfile.mkdtemp(prefix="mechkit-worker-offload-")
        return load_model(self.spec, device=None if device_map else self.device, dtype=self.dtype,
                          device_map=device_map, offload_folder=offload_folder, backend=self.backend,
                          remote=self.remote)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _cuda_indices(device_map: dict[str, str]) -> list[int]:
    return sorted({int(d.split(":")[1]) if ":" in d else 0 for d in device_map.values() if d.startswith("cuda")})


def _renumbered(device_map: dict[str, str]) -> dict[str, str]:
    """Ray shows a worker its GPUs as ``cuda:0..k-1``: the map's k GPUs (``cuda:2``, ``cuda:5``) in order.

    >>> _renumbered({"model.layers.0": "cuda:2", "model.layers.1": "cuda:5", "lm_head": "cpu"})
    {'model.layers.0': 'cuda:0', 'model.layers.1': 'cuda:1', 'lm_head': 'cpu'}
    """
    new = {old: i for i, old in enumerate(_cuda_indices(device_map))}

    def move(d: str) -> str:
        if not d.startswith("cuda"):
            return d
        return f"cuda:{new[int(d.split(':')[1]) if ':' in d else 0]}"

    return {module: move(d) for module, d in device_map.items()}
