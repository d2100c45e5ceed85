"""How a model is cut: structured pruning of its weights (:mod:`.surgery`), and running it from a cut
point in the middle (:mod:`.partial`: blocks L… on a captured hidden state, what ablation sweeps and
layer-wise pruning reuse)."""
