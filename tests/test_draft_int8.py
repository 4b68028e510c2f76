"""``draft_int8``: the draft's products on int8 weights on a CPU. The draft's guesses change a little, the output
not at all: greedy equals plain greedy in float32 (the sampled case is in test_tree_decoding's chi-square test)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_models import copy_draft, make_tiny_target

from eagle3_hub.generation.tree import costs, fast_paths, generate
from eagle3_hub.generation.tree.config import TreeConfig

needs_int8 = pytest.mark.skipif(
    fast_paths.int8_linear(torch.randn(8, 16)) is None, reason="this torch build has no quantized int8 CPU kernels"
)


@needs_int8
def test_int8_linear_is_close_to_the_float_product_and_declines_other_weights():
    torch.manual_seed(0)
    for bias in (None, torch.randn(300)):
        w = torch.randn(300, 64)
        product = fast_paths.int8_linear(w, bias)
        for x in (torch.randn(1, 64), torch.randn(4, 64), torch.randn(2, 3, 64)):
            ref = F.linear(x, w, bias)
            got = product(x)
            assert got.shape == ref.shape and got.dtype == torch.float32
            assert float((got - ref).abs().max()) < 0.05 * float(ref.abs().max())
    assert fast_paths.int8_linear(torch.randn(300, 64).bfloat16()) is None


@needs_int8
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_with_an_int8_draft_equals_plain_generate(arch):
    target = make_tiny_target(arch)
    draft = copy_draft(target)
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    ids = torch.randint(3, 256, (1, 12), generator=torch.Generator().manual_seed(1))
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False, pad_token_id=0)
    tree = {"depth": 4, "tree_top_k": 3, "total_tokens": 9, "min_node_prob": 0.0}
    out = generate(target, draft, ids, max_new_tokens=64, eos_token_id=[], draft_int8=True, **tree)
    assert torch.equal(out.sequences, ref)
    assert out.stats.tree["draft_int8"] is True
    assert out.stats.target_forwards < 64  # the int8 draft's tokens were accepted
    # the draft itself is unchanged: its own forward still multiplies in float32
    assert all(torch.equal(before[k], v) for k, v in draft.state_dict().items())
    assert all(type(m) is torch.nn.Linear for m in (draft.fc, draft.lm_head, draft.midlayer.self_attn.q_proj))


@needs_int8
def test_the_int8_copy_shares_the_drafts_weights_and_keeps_fc_in_float():
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    fast = fast_paths.int8_draft(draft)
    assert fast is not draft and fast_paths.int8_draft(draft) is fast  # cached while the weights are unchanged
    assert fast.midlayer.hidden_norm.weight is draft.midlayer.hidden_norm.weight
    assert fast.lm_head.weight is draft.lm_head.weight  # kept for the code that reads its dtype
    assert type(fast.lm_head) is not torch.nn.Linear and type(fast.midlayer.mlp.down_proj) is not torch.nn.Linear
    x = torch.randn(1, 3, draft.fc.in_features)
    torch.testing.assert_close(fast.fc(x), draft.fc(x), rtol=1e-4, atol=1e-4)  # fc: float32 (packed or not)
    with torch.no_grad():
        draft.lm_head.weight.mul_(2)
    assert fast_paths.int8_draft(draft) is not fast  # new weights: quantized again


def test_int8_drafts_get_their_own_cost_tables_and_clear_errors():
    target = make_tiny_target("llama")
    draft = copy_draft(target)
    assert costs.cost_key(target, draft, 4, False) != costs.cost_key(target, draft, 4, False, draft_int8=True)
    assert costs.cost_key(target, draft, 4, False) == costs.cost_key(target, draft, 4, False, draft_int8=False)
    with pytest.raises(ValueError, match="draft_int8 runs the draft on a CPU's int8 kernels"):
        TreeConfig(draft_int8=True).resolve(torch.device("cuda"), torch.float32, False, 256)
    ids = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="draft_int8 needs a float32 draft on a CPU"):
        generate(target.to(torch.bfloat16), copy_draft(target).to(torch.bfloat16), ids, max_new_tokens=4, draft_int8=True)
