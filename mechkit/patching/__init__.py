"""Activation patching, the logit lens and direct logit attribution, on mechkit's hook names.

- :mod:`~mechkit.patching.answers`: answer tokens (one token each, or refused) and the metrics:
  logit difference, answer log-probability, normalized recovery.
- :mod:`~mechkit.patching.patch`: a :class:`Patch` (hook point, positions, heads or neurons) and
  :func:`run_patched`, one patched forward from a source cache or a second prompt.
- :mod:`~mechkit.patching.scan`: every layer × position (or layer × head) patch of one point, several
  patches per forward on the target's reused prefix; :func:`denoise` and :func:`noise` name the direction.
- :mod:`~mechkit.patching.attribution`: attribution patching, every patch of a scan estimated from one
  forward and one backward, and its rank agreement with exact patching.
- :mod:`~mechkit.patching.lens`: the logit lens and direct logit attribution with the final norm's scale
  frozen at the run's values.
- :mod:`~mechkit.patching.pairs`: clean/corrupted prompt pairs (IOI's name swap, an ICL task's shuffled
  labels, your own); :mod:`~mechkit.patching.study`: scans, DLA and lens over several pairs, averaged.
"""

from mechkit.patching.answers import answer_id, answer_logprob, logit_diff, normalized_recovery
from mechkit.patching.attribution import agreement, attribute, attribute_patching
from mechkit.patching.lens import DLA, direct_logit_attribution, dla_names, lens_names, logit_lens
from mechkit.patching.pairs import PromptPair, icl_pairs, ioi_pairs, task_pairs
from mechkit.patching.patch import Patch, run_patched
from mechkit.patching.scan import PatchScan, denoise, noise, scan
from mechkit.patching.study import Study, run_study

__all__ = ["DLA", "Patch", "PatchScan", "PromptPair", "Study", "agreement", "answer_id", "answer_logprob", "attribute",
           "attribute_patching", "denoise", "direct_logit_attribution", "dla_names", "icl_pairs", "ioi_pairs",
           "lens_names", "logit_diff", "logit_lens", "noise", "normalized_recovery", "run_patched", "run_study", "scan",
           "task_pairs"]
