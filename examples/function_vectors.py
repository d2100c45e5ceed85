"""Extract a function vector (Todd et al. 2024) and use it, through the Python API.

1. mean output of every head at the last token of clean 10-shot prompts;
2. each head's average indirect effect on shuffled-label prompts (how much its clean mean output
   restores P(correct answer));
3. the function vector = the top-k heads' means projected through the output projection, summed;
4. add it at each layer of zero-shot prompts (dev), keep the best layer, score held-out test
   prompts, save the vector and load it back.

Run:  python examples/function_vectors.py [--model llama] [--task past-tense] [--out fv.safetensors]
"""

from __future__ import annotations

import argparse

import mechkit as mk
from mechkit.actvec import (
    ActivationVector,
    apply_vector,
    choose_layer,
    function_vector,
    indirect_effects,
    mean_head_outputs,
    score_edited,
)
from mechkit.model.headspec import top_heads
from mechkit.tasks.shuffled import shuffled_label_prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama")
    parser.add_argument("--task", default="past-tense")
    parser.add_argument("--shots", type=int, default=10)
    parser.add_argument("--n", type=int, default=20, help="dev and test prompts each")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--out", default="function-vector.safetensors")
    args = parser.parse_args()
    model = mk.load_model(args.model)

    clean = mk.build_prompts(args.task, n=24, shots=args.shots, seed=0)
    means = mean_head_outputs(model, clean)
    corrupted = shuffled_label_prompts(args.task, n=10, shots=args.shots, seed=1)
    aie = indirect_effects(model, corrupted, means).mean(0)
    heads = top_heads(aie, args.top_k)
    print("top heads:", ", ".join(f"{h} ({aie[h.layer, h.head]:+.3f})" for h in heads))
    fv = ActivationVector(function_vector(model, means, heads), "function-vector", args.task, layer=-1,
                          mode="add", model_sha256=model.weights_sha256(), heads=[h.to_dict() for h in heads])

    dev = mk.build_prompts(args.task, n=args.n, shots=0, seed=2)
    layers = range(model.anatomy.n_layers)
    scores = score_edited(model, dev, [fv.edit(L) for L in layers])  # one batched pass over every layer
    fv.layer = choose_layer({L: s.accuracy for L, s in zip(layers, scores, strict=True)},
                            {L: s.logprob for L, s in zip(layers, scores, strict=True)})
    test = mk.build_prompts(args.task, n=args.n, shots=0, seed=3)
    zero, added = score_edited(model, test, [None, fv.edit()])
    print(f"{args.task}: zero-shot {zero.accuracy:.2f} -> zero-shot + FV at layer {fv.layer} {added.accuracy:.2f}")

    fv.save(args.out)
    again = ActivationVector.load(args.out, model)  # checks d_model and the model's weights hash
    prompt = test[0]
    ids = model.to_tokens(prompt.text)
    with apply_vector(model, again):  # the vector at the prompt's last token while generating
        out = model.model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    print(f"{prompt.query!r} -> {model.tokenizer.decode(out[0, ids.shape[1]:])!r} (expected {prompt.answer!r})")


if __name__ == "__main__":
    main()
