"""Where a model's weights live: one model larger than one device, spread by accelerate.

``load_model(spec, device_map=..., max_memory=..., offload_folder=...)`` spreads a model's modules
over the devices a :class:`~mechkit.model.placement.request.Dispatch` names — GPUs, CPU memory, and
disk for what fits nowhere else. accelerate does the work: :func:`~mechkit.model.placement.spread.assign_devices`
asks ``infer_auto_device_map`` (after ``get_balanced_memory`` for the balanced strategies) on the model
or on an empty copy of it (``init_empty_weights``), local directories then load straight into that map
through ``from_pretrained(device_map=...)`` and models already in memory (tiny, toy, GGUF-converted,
pruned, objects) go through ``dispatch_model``.

accelerate's hooks move each module's inputs to its device. A module offloaded to CPU memory (the
``"cpu"`` entries when the main device is an accelerator) or to disk keeps its parameters on
``meta`` and its weights in ``module._hf_hook.weights_map``, loaded for the module's forward and
dropped after it. Everything that reads or edits weights goes through this package, so it reaches
those weights. One module per question:

- :mod:`.request` — what the user asked for (``--device-map``, ``--max-memory``, ``--offload-folder``),
  checked before anything loads, each failure one :class:`~mechkit.errors.ModelLoadError` line;
- :mod:`.devices` — how torch and accelerate spell devices, and which one runs a map;
- :mod:`.spread` — which module goes where, and putting the model there (refusing, before any weight
  loads, a ``max_memory`` too small for the model when no offload folder was given);
- :mod:`.stored` — where a placed model's weights and inputs are: :func:`~.stored.module_tensor` reads
  one, :func:`~.stored.state_items` gives the whole state dict (what ``weights_sha256`` hashes);
- :mod:`.ties` — which weights are one tensor under several names, remembered before dispatch hides it;
- :mod:`.slots` — :class:`~.slots.WeightSlot` edits one weight reversibly: an offloaded weight is
  edited in a copy that the module's hook reads in place of the stored one until the slot is restored;
  the stored weights are never written, so restoring them is bit-exact by construction;
- :mod:`.copies` — a plain, hook-free copy of a placed model, filled from its stored weights.
"""
