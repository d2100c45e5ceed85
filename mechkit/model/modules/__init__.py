"""The kinds of module mechkit reads weights and activations through: linear layers (Linear, Conv1D,
fused projections) and norms (LayerNorm, RMSNorm, with their offsets)."""
