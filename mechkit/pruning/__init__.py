"""Training-free structured pruning guided by what the analyses found (see :mod:`.pipeline`;
:mod:`.study` measures pruned copies the way the ``prune`` plugin reports them)."""

from mechkit.pruning.calibration import Calibration, calibrate
from mechkit.pruning.guides import GUIDES, Scores
from mechkit.pruning.masking import masked
from mechkit.pruning.pipeline import circuit_scores, guide_scores
from mechkit.pruning.plan import UnitsToRemove
from mechkit.pruning.reconstruct import reconstruct
from mechkit.pruning.select import make_plan, parse_guides, parse_levels, parse_sparsity, parse_targets
from mechkit.pruning.slicing import prune_copy, save_pruned
from mechkit.pruning.stats import UnitStats, collect_stats
from mechkit.pruning.study import PruneConfig, PruneStudy

__all__ = ["GUIDES", "Calibration", "PruneConfig", "PruneStudy", "Scores", "UnitStats", "UnitsToRemove", "calibrate",
           "circuit_scores", "collect_stats", "guide_scores", "make_plan", "masked", "parse_guides",
           "parse_levels", "parse_sparsity", "parse_targets", "prune_copy", "reconstruct", "save_pruned"]
