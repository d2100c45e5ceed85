"""Hook layer: read and write activations by stable hook names; always detached on exit."""

from mechkit.hooking.attention import pattern_hooks
from mechkit.hooking.core import Cache, gradients, hooks, record, run_with_cache
from mechkit.hooking.points import SUFFIXES, HookPoint, all_names, resolve

__all__ = ["SUFFIXES", "Cache", "HookPoint", "all_names", "gradients", "hooks", "pattern_hooks", "record",
           "resolve", "run_with_cache"]
