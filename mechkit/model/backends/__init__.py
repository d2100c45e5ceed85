"""Where a model's forwards run: one backend per file behind :mod:`.base`.

``native`` (:data:`.base.NATIVE`): PyTorch hooks on the local model. ``nnsight``
(:mod:`.nnsight_backend`): every forward one nnsight trace, in this process or sent as jobs to a server —
NDIF (:mod:`.ndif`) or its strict offline simulation (:mod:`.simulation`), named by :mod:`.remotes`.
Beside them: what remote jobs report (:mod:`.jobs`), what an NDIF server accepts (:mod:`.whitelist`), and
steps that read weights where the weights are (:mod:`.weight_reads`), and whether a forward builds an
autograd graph (:mod:`.grad`). No backend file imports another.
"""
