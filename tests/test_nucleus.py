"""The sampling distribution from its support (``generation.tree.nucleus``) equals transformers' warpers'."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from eagle3_hub.generation.tree.acceptance import Processing, sampling_warpers
from eagle3_hub.generation.tree.nucleus import Nucleus, scattered


def warped(processors, scores):
    ids = torch.zeros(scores.shape[0], 1, dtype=torch.long)
    return torch.softmax(processors(ids, scores.clone()), dim=-1)


@pytest.mark.parametrize(
    "temperature, top_k, top_p", [(1.0, 0, 0.9), (0.7, 0, 0.9), (0.7, 50, 0.9), (1.3, 20, 1.0), (1.0, 0, 0.999), (0.5, 7, 0.5)]
)
@pytest.mark.parametrize("logits", ["peaked", "flat", "bf16-ties"])
def test_the_support_gives_the_warpers_distribution(temperature, top_k, top_p, logits):
    g = torch.Generator().manual_seed(0)
    V = 5000
    scores = torch.randn(6, V, generator=g) * (6.0 if logits == "peaked" else 0.5)
    if logits == "bf16-ties":  # a bf16 head: many scores tie, at the top-k boundary too
        scores = (scores * 4).to(torch.bfloat16).float()
    processors = sampling_warpers(True, temperature, top_k, top_p)
    nucleus = Nucleus.of(processors)
    assert nucleus is not None
    expected = warped(processors, scores)
    # a first width of 4: flat rows widen it several times; the result does not depend on it
    for width in (4, 256):
        idx, p = nucleus(scores, width=width)
        got = scattered(idx, p, scores)
        assert torch.allclose(p.sum(-1), torch.ones(6))
        # the same probabilities; token for token but where tokens tie at the boundary (as many kept, maybe others)
        # or the float rounding of a cumulative sum puts one boundary token on the other side
        assert torch.allclose(got.sort(-1).values, expected.sort(-1).values, atol=1e-5)
        assert ((got > 0).sum(-1) - (expected > 0).sum(-1)).abs().max() <= 1
        differ = (got > 0) != (expected > 0)
        boundary = scores.masked_fill(expected == 0, float("inf")).amin(-1, keepdim=True)
        assert torch.equal(scores[differ], boundary.expand_as(scores)[differ])
        if logits != "bf16-ties":
            assert not differ.any() and torch.allclose(got, expected, atol=1e-6, rtol=1e-5)


def test_rows_widen_alone_and_pad_their_support():
    """A batch of a peaked row and a flat one: only the flat row reads past the first width; the peaked row keeps its
    few tokens, padded with probability 0 (which a draw, the walk's token match and ``scattered`` all ignore)."""
    g = torch.Generator().manual_seed(3)
    scores = torch.cat([torch.randn(1, 4000, generator=g) * 8.0, torch.randn(1, 4000, generator=g) * 2.5])
    processors = sampling_warpers(True, 1.0, 0, 0.9)
    idx, p = Nucleus.of(processors)(scores, width=16)
    assert idx.shape[1] == 1024  # 16 -> 128 -> 1024: the flat row holds 368 tokens
    assert (p[0] > 0).sum() < 16 and (p[1] > 0).sum() > 128
    assert torch.equal(idx[0, 16:], idx[0, :1].expand(1024 - 16))
    assert torch.allclose(scattered(idx, p, scores), warped(processors, scores), atol=1e-6)
    process = Processing(processors, True, torch.Generator().manual_seed(4))
    drawn = process.next_token(scores[:1].expand(2000, -1), None)
    assert set(drawn.tolist()) <= set(idx[0][p[0] > 0].tolist())


def test_min_tokens_to_keep_and_lists_it_cannot_serve():
    scores = torch.tensor([[8.0, 0.0, -1.0, -2.0, -3.0]])
    warpers = LogitsProcessorList([TopPLogitsWarper(0.5, min_tokens_to_keep=3)])
    assert torch.allclose(Nucleus.of(warpers).dense(scores), warped(warpers, scores))
    assert (Nucleus.of(warpers).dense(scores) > 0).sum() == 3
    # the whole vocabulary (temperature alone), a processor that reads the history, an order it does not know
    assert Nucleus.of(LogitsProcessorList([TemperatureLogitsWarper(0.7)])) is None
    assert Nucleus.of(LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2), TopPLogitsWarper(0.9)])) is None
    assert Nucleus.of(LogitsProcessorList([TopPLogitsWarper(0.9), TopKLogitsWarper(5)])) is None
    assert Nucleus.of(LogitsProcessorList([TopKLogitsWarper(5, filter_value=-1e4)])) is None
    assert Processing(sampling_warpers(True, 0.7, 0, 0.9), True, None).nucleus is not None
    assert Processing(sampling_warpers(False), False, None).nucleus is None


def test_a_draw_from_the_support_follows_the_distribution():
    from scipy.stats import chisquare

    scores = torch.randn(1, 3000, generator=torch.Generator().manual_seed(1)) * 3
    process = Processing(sampling_warpers(True, 0.8, 0, 0.9), True, torch.Generator().manual_seed(2))
    expected = warped(process.processors, scores)[0]
    n = 20000
    tokens = process.next_token(scores.expand(n, -1), None)
    counts = torch.bincount(tokens, minlength=3000).double()
    assert counts[expected == 0].sum() == 0
    big = expected * n >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big] * n, (expected[~big] * n).sum()[None]]).double()
    obs, exp = obs[exp > 0], exp[exp > 0]
    assert chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue > 1e-3
