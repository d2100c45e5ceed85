"""Teacher-forced scoring equals greedy decoding's exact match, prompt by prompt."""

from __future__ import annotations

import pytest

from mechkit.eval.scoring import encode, greedy_exact_match, score_prompts
from mechkit.tasks import build_prompts


@pytest.mark.slow
def test_teacher_forced_equals_greedy_on_embedded_model(embedded):
    for task, seed in (("capitalize", 0), ("country-capital", 1), ("ioi", 0), ("plus-one", 0)):
        prompts = build_prompts(task, n=5, seed=seed)  # 5 per task: the greedy reference decodes one by one
        scored = score_prompts(embedded, prompts, batch_size=4)
        assert scored.correct == greedy_exact_match(embedded, prompts), task


@pytest.mark.slow
def test_answers_spelled_with_other_tokens_still_count(embedded):
    # On these prompts SmolLM2 writes e.g. " LADYBUG" as L|AD|Y|B|UG rather than the canonical L|AD|Y|BUG.
    # Of seed 0's first 20, prompts 5, 8, 10 and 11 need a decode (5 right, the others wrong): 5..11 hold both.
    prompts = build_prompts("capitalize", n=20, seed=0)[5:12]
    scored = score_prompts(embedded, prompts)
    assert scored.decoded >= 2 and 0 < sum(scored.correct) < len(prompts)
    assert scored.correct == greedy_exact_match(embedded, prompts)


@pytest.mark.slow
def test_embedded_model_learns_in_context(embedded):
    few = score_prompts(embedded, build_prompts("past-tense", n=20, shots=10, seed=0))
    zero = score_prompts(embedded, build_prompts("past-tense", n=20, shots=0, seed=0))
    assert few.accuracy >= 0.8 and zero.accuracy == 0.0
    assert few.logprob > zero.logprob


def test_batch_size_does_not_change_scores(tiny_llama):
    prompts = build_prompts("swap", n=12, shots=3, seed=0)
    one = score_prompts(tiny_llama, prompts, batch_size=1)
    many = score_prompts(tiny_llama, prompts, batch_size=12)
    assert one.correct == many.correct
    assert one.logprobs == pytest.approx(many.logprobs, abs=1e-4)
    assert one.correct == greedy_exact_match(tiny_llama, prompts)


def test_encode_marks_answer_tokens(tiny_llama):
    ids, start = encode(tiny_llama.tokenizer, "input: a\noutput:", " B")
    assert tiny_llama.tokenizer.decode(ids[start:]) == " B\n"
    assert tiny_llama.tokenizer.decode(ids[:start]) == "input: a\noutput:"


def test_multiple_accepted_answers(tiny_llama):
    prompts = build_prompts("modular+two-sum-plus-one", n=4, shots=2, seed=0)
    assert all(len(p.accepted) >= 1 for p in prompts)
    scored = score_prompts(tiny_llama, prompts)
    assert len(scored.correct) == 4 and all(lp <= 0 for lp in scored.logprobs)


def test_ioi_reports_logit_difference(tiny_llama):
    import torch

    from mechkit.eval.scoring import encode

    prompts = build_prompts("ioi", n=3, seed=0)
    scored = score_prompts(tiny_llama, prompts)
    assert scored.logit_diff is not None and "logit_diff" in scored.as_dict()
    # recompute the first prompt's difference by hand
    p = prompts[0]
    ids, start = encode(tiny_llama.tokenizer, p.text, p.answer, "")
    rival, rival_start = encode(tiny_llama.tokenizer, p.text, p.distractor, "")
    with torch.no_grad():
        logits = tiny_llama(torch.tensor([ids[:start]]))[0, -1]
    expected = float(logits[ids[start]] - logits[rival[rival_start]])
    single = score_prompts(tiny_llama, prompts[:1])
    assert abs(single.logit_diff - expected) < 1e-4
    assert score_prompts(tiny_llama, build_prompts("swap", n=2, shots=1)).logit_diff is None
