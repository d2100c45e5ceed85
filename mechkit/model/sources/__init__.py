"""Where a model's weights come from, besides a directory or the hub: a GGUF file (dequantized once and
cached as safetensors), the embedded SmolLM2, tiny random-initialised test models, and the toy model
mechkit trains itself. :func:`mechkit.model.loading.load_model` chooses among them by the spec."""
