"""Activation patching, the logit lens and direct logit attribution, on mechkit's hook names.

- :mod:`~mechkit.patching.answers`: answer tokens (one token each, or refused) and the metrics:
  logit difference, answer log-probability, normalized recovery.
- :mod:`~mechkit.patching.patch`: a :class:`Patch` (hook point, positions, heads or neurons) and
  :func:`run_patched`, one patched forward from a source cache or a second prompt.
- :mod:`~mechkit.patching.scan`: every layer × position (or layer × head) patch of one point, several
  patches per forward on the target's reused prefix; :func:`denoise` and :func:`noise` name the direction.
- :mod:`~mechkit.patching.lens`: the logit lens and direct logit attribution with the final norm's scale
  frozen at the run's values.
"""

from mechkit.patching.answers import answer_id, answer_logprob, logit_diff, normalized_recovery
from mechkit.patching.lens import DLA, direct_logit_attribution, dla_names, lens_names, logit_lens
from mechkit.patching.patch import Patch, run_patched
from mechkit.patching.scan import PatchScan, denoise, noise, scan

__all__ = ["DLA", "Patch", "PatchScan", "answer_id", "answer_logprob", "denoise", "direct_logit_attribution",
           "dla_names", "lens_names", "logit_diff", "logit_lens", "noise", "normalized_recovery", "run_patched", "scan"]
