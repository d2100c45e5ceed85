"""Executors: where independent units of work run (serial here, Ray actors when asked).

A plugin whose work splits into independent units — the exact sweep's (batch, layer) pairs, ablation
baselines, a λ grid, a layer scan — declares :data:`mechkit.options.EXECUTION` among its options and
submits its units with ``ctx.map_units(fn, shared, units, keys)``. The executor decides where they run:

- ``serial`` (:class:`SerialExecutor`): in the run's process, on its model, streaming results;
- ``ray`` (:class:`~mechkit.executors.ray_pool.RayExecutor`): long-lived actors that each load the
  model once (:class:`LoadSpec`), fed chunks of units; a killed worker's chunk runs again elsewhere.

Either way each unit's result is kept as a step the moment it arrives (:func:`map_units`), results come
back in submission order, and a unit's result depends only on the unit — so a report is the same
whatever the executor or the number of workers, and a killed run resumes from its finished units.

Nothing here imports torch or Ray until it runs work.
"""

from mechkit.executors.base import Executor, OnResult, SerialExecutor, UnitFn, chunks
from mechkit.executors.choose import check_execution, open_executor
from mechkit.executors.load import LoadSpec
from mechkit.executors.units import map_units

__all__ = ["Executor", "LoadSpec", "OnResult", "SerialExecutor", "UnitFn", "check_execution", "chunks",
           "map_units", "open_executor"]
