"""`eagle3-hub train`: data shapes, loss masks, draft vocabulary, the TTT objective against a naive
step-by-step reference, features (online / offline), end-to-end runs on a tiny random target (and one short
run on the real SmolLM2-135M), resume after SIGKILL, LoRA mode and bad input.

Everything runs in float32 on the CPU. The tiny target has SmolLM2's tokenizer and chat template (49152
tokens), 3 decoder layers of width 64 and a sharpened output head, so that its next-token choices are
learnable and regenerated answers contain the tokens it predicts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections import namedtuple
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from datasets import Dataset
from safetensors.torch import load_file
from tiny_models import make_tiny_target
from training_helpers import recipe_for, run_cli, write_jsonl, write_recipe
from transformers import AutoTokenizer, DynamicCache

from eagle3_hub import Eagle3DraftModel
from eagle3_hub.devices import cpu_has_bf16_units
from eagle3_hub.publish import after_training
from eagle3_hub.targets import load_target, resolve_target
from eagle3_hub.training import features as features_module
from eagle3_hub.training.batching import LengthGroupedBatches, collate
from eagle3_hub.training.data import build_conversations
from eagle3_hub.training.features import OfflineFeatures, ShardReader, aux_features, sample_key
from eagle3_hub.training.presets import PRESETS
from eagle3_hub.training.recipe import load_recipe, parse_overrides
from eagle3_hub.training.sources import DataError, load_source, normalise_example, prompt_key, source_spec
from eagle3_hub.training.splits import held_out_split
from eagle3_hub.training.tokenise import render_with_mask, tokenize_dataset, user_prefix
from eagle3_hub.training.train import resolve_mixed_precision, train
from eagle3_hub.training.ttt import acceptance_metrics, target_logit_positions, ttt_loss
from eagle3_hub.training.vocab import coverage_table, remap_draft_vocab, select_draft_vocab, token_counts

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# ----------------------------------------------------------------------------------------------- fixtures
# smollm2_tokenizer, tiny_target_dir and data_dir are in conftest.py
@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_target_dir, data_dir):
    """One end-to-end run: regenerated answers, 30 steps, eval every 10. Returns (recipe, draft folder)."""
    tmp = tmp_path_factory.mktemp("e2e")
    recipe = recipe_for(
        tmp,
        tiny_target_dir,
        [data_dir / "sharegpt.jsonl"],
        data={"regenerate": True, "max_new_tokens": 16},
        train={"max_steps": 30, "lr": 5e-3, "eval_every": 10, "save_every": 10},
    )
    out = train(recipe)
    after_training(recipe, out)  # what `eagle3-hub train` does next: the model card
    return recipe, out


# ----------------------------------------------------------------------------------------------- data
def test_every_chat_shape_is_normalised_to_messages():
    sharegpt = {
        "conversations": [
            {"from": "gpt", "value": "Hi!"},
            {"from": "human", "value": "Hello"},
            {"from": "gpt", "value": "Hi, how can I help?"},
            {"from": "tool", "value": "x"},
        ]
    }
    assert normalise_example(sharegpt)["messages"] == [  # leading assistant turn and unknown roles dropped
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi, how can I help?"},
    ]
    openai = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "   "},
        ]
    }
    assert normalise_example(openai)["messages"] == openai["messages"][:3]
    assert normalise_example({"prompt": "Tell me a joke."})["messages"] == [{"role": "user", "content": "Tell me a joke."}]
    assert normalise_example({"question": "1+1?", "answer": "2"})["messages"] == [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},
    ]
    assert normalise_example({"instruction": "Translate.", "input": "cat", "output": "chat"})["messages"][0] == {
        "role": "user",
        "content": "Translate.\n\ncat",
    }
    assert normalise_example({"unrelated": 3})["messages"] == []


def test_local_files_of_each_shape_and_the_presets(data_dir):
    sharegpt = load_source(str(data_dir / "sharegpt.jsonl"))
    assert len(sharegpt) == 40 and sharegpt[3]["messages"][1] == {"role": "assistant", "content": "3 plus 4 is 7."}
    ultrachat = load_source({"path": str(data_dir / "ultrachat.parquet"), "max_samples": 5})
    assert len(ultrachat) == 5 and [m["role"] for m in ultrachat[0]["messages"]] == ["user", "assistant"] * 2
    prompts = load_source(str(data_dir / "prompts.json"))
    assert prompts[0]["messages"] == [{"role": "user", "content": "Write a haiku about the number 0."}]
    # the presets name the real Hub datasets (not downloadable here: their shapes are the files above)
    assert source_spec("ultrachat") == {"path": "HuggingFaceH4/ultrachat_200k", "split": "train_sft"}
    assert source_spec("sharegpt")["path"] == PRESETS["sharegpt"]["path"] == "Aeala/ShareGPT_Vicuna_unfiltered"
    assert source_spec({"path": "ultrachat", "max_samples": 7})["max_samples"] == 7


def test_dedupe_length_filter_and_seeded_order(tmp_path, data_dir, smollm2_tokenizer):
    rows = [
        {"prompt": "Same question?", "response": "a"},
        {"prompt": "same   QUESTION?", "response": "b"},
        {"prompt": "Other question?", "response": "c"},
        {"prompt": "x" * 30000, "response": "too long"},
    ]
    rows += [{"prompt": f"Question {i}?", "response": str(i)} for i in range(20)]
    path = write_jsonl(tmp_path / "dups.jsonl", rows)
    kw = dict(target=None, tokenizer=smollm2_tokenizer, work_dir=tmp_path / "w", regenerate_responses=False)
    a = build_conversations([str(path)], seed=1, **kw)
    firsts = [ex["messages"][0]["content"] for ex in a]
    assert len(a) == 22 and "x" * 30000 not in firsts and sum(f.lower().startswith("same") for f in firsts) == 1
    assert [ex["messages"] for ex in build_conversations([str(path)], seed=1, **kw)] == list(a["messages"])
    assert [ex["messages"] for ex in build_conversations([str(path)], seed=2, **kw)] != list(a["messages"])


def masked_text(tokenizer, sample) -> str:
    return tokenizer.decode([i for i, m in zip(sample["input_ids"], sample["loss_mask"]) if m])


def test_loss_mask_covers_assistant_turns_only(smollm2_tokenizer):
    msgs = [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! Nice day."},
        {"role": "user", "content": "And then?"},
        {"role": "assistant", "content": "Then we rest."},
    ]
    out = render_with_mask(smollm2_tokenizer, msgs, max_length=512)
    assert len(out["input_ids"]) == len(out["loss_mask"]) and not out["truncated"]
    # SmolLM2's template has no {% generation %} markers: spans come from rendering growing prefixes
    assert masked_text(smollm2_tokenizer, out) == "Hello! Nice day.<|im_end|>\nThen we rest.<|im_end|>\n"

    zephyr = AutoTokenizer.from_pretrained(resolve_target(None)[0])
    zephyr.chat_template = (
        "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '</s>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
    )
    out = render_with_mask(zephyr, msgs, max_length=512)
    assert masked_text(zephyr, out) == "Hello! Nice day.</s>\nThen we rest.</s>\n"

    rewriting = AutoTokenizer.from_pretrained(resolve_target(None)[0])  # drops earlier assistant turns
    rewriting.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
        "{{ m['role'] + ': ' + m['content'] + '\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(DataError, match="prefix by prefix"):
        render_with_mask(rewriting, msgs, max_length=512)


def test_long_samples_are_truncated_and_counted(smollm2_tokenizer):
    short = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    n = len(render_with_mask(smollm2_tokenizer, short, 10_000)["input_ids"])
    long = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "word " * 200}]
    prompt_only = [{"role": "user", "content": "A prompt nobody answered."}]
    ds = Dataset.from_list([{"messages": m} for m in (short, long, prompt_only)])
    tok, report = tokenize_dataset(ds, smollm2_tokenizer, max_length=n)  # `short` fits exactly: not truncated
    assert report == {"samples": 3, "truncated": 1, "dropped_no_loss_tokens": 1, "kept": 2}
    assert [len(x) for x in tok["input_ids"]] == [n, n]
    with pytest.raises(DataError, match="no chat template"):
        bare = AutoTokenizer.from_pretrained(resolve_target(None)[0])
        bare.chat_template = None
        tokenize_dataset(ds, bare, max_length=64)


def test_self_synthesis_and_regeneration_resume_from_their_caches(tmp_path, tiny_target_dir, data_dir):
    target, tok = load_target(str(tiny_target_dir))
    prefix = user_prefix(tok)
    assert prefix.endswith("<|im_start|>user\n") and "<|im_start|>system" in prefix
    kw = dict(
        target=target, tokenizer=tok, work_dir=tmp_path, synthesize=3, regenerate_responses=True, max_new_tokens=8, batch_size=4
    )
    convs = build_conversations([], **kw)
    assert len(convs) == 3 and all([m["role"] for m in ex["messages"]] == ["user", "assistant"] for ex in convs)
    caches = sorted(p.name for p in tmp_path.glob("*.jsonl"))
    assert caches[0].startswith("regen-") and caches[1] == "synth-seed0.jsonl"
    sizes = {p: p.stat().st_size for p in tmp_path.glob("*.jsonl")}
    again = build_conversations([], **kw)  # everything from the caches: nothing generated, nothing appended
    assert list(again["messages"]) == list(convs["messages"])
    assert {p: p.stat().st_size for p in tmp_path.glob("*.jsonl")} == sizes
    # with the dataset's own answers kept (regenerate: false), synthesised prompts are still answered
    mixed = build_conversations([str(data_dir / "prompts.json")], **{**kw, "regenerate_responses": False})
    roles = sorted(tuple(m["role"] for m in ex["messages"]) for ex in mixed)
    assert roles.count(("user", "assistant")) == 3 and roles.count(("user",)) == 6
    # a source marked `regenerate: false` keeps its answers while the rest is answered by the target; the
    # synthesised prompts' answers come from the cache above (the regenerated part is the same data)
    sizes = {p: p.stat().st_size for p in tmp_path.glob("*.jsonl")}
    kept = build_conversations([{"path": str(data_dir / "sharegpt.jsonl"), "regenerate": False, "max_samples": 5}], **kw)
    assert {p: p.stat().st_size for p in tmp_path.glob("*.jsonl")} == sizes
    answers = {ex["messages"][0]["content"]: ex["messages"][1]["content"] for ex in kept}
    assert len(kept) == 8 and sum(q.endswith("?") and a.endswith(".") and " plus " in a for q, a in answers.items()) == 5
    assert all(ex["messages"] in list(convs["messages"]) for ex in kept if " plus " not in ex["messages"][0]["content"])
    # another synthesis seed writes other prompts, to a cache of its own
    other = build_conversations([], **{**kw, "synthesize_seed": 7, "synthesize": 2})
    assert (tmp_path / "synth-seed7.jsonl").exists() and len(other) == 2
    # openers start the prompts in turn and get a cache of their own
    openers = ["Write a poem", "Solve the puzzle"]  # each >= 10 characters: no prompt is rejected
    steered = build_conversations([], **{**kw, "synthesize_seed": 7, "synthesize": 4, "synthesize_openers": openers})
    caches = {p.name for p in tmp_path.glob("synth-seed7-openers-*.jsonl")}
    assert len(caches) == 1 and len(steered) == 4
    written = [json.loads(line)["prompt"] for line in (tmp_path / caches.pop()).read_text().splitlines()]
    assert written[0].startswith("Write a poem ") and written[1].startswith("Solve the puzzle ")
    assert all(w.startswith(("Write a poem ", "Solve the puzzle ")) for w in written) and len(set(written)) == 4
    assert sorted(ex["messages"][0]["content"] for ex in steered) == sorted(written)


def test_held_out_samples_come_from_sources_no_earlier_stage_trained_on(tmp_path, tiny_target_dir, data_dir):
    target, tok = load_target(str(tiny_target_dir))
    kw = dict(target=target, tokenizer=tok, work_dir=tmp_path, regenerate_responses=False)
    earlier = {"path": str(data_dir / "sharegpt.jsonl"), "eval": False}
    new = {"path": str(data_dir / "prompts.json")}
    convs = build_conversations([earlier, new], **kw)
    old_prompts = {prompt_key(m) for m in load_source(str(data_dir / "sharegpt.jsonl"))["messages"]}
    assert list(convs["eval_ok"]) == [prompt_key(m) not in old_prompts for m in convs["messages"]]
    assert 0 < sum(convs["eval_ok"]) < len(convs)
    rows = Dataset.from_list([{"index": i, "eval_ok": ok} for i, ok in enumerate(convs["eval_ok"])])
    split = held_out_split(rows, eval_samples=4, seed=0)
    assert "eval_ok" not in split["test"].column_names and len(split["test"]) == min(4, max(1, len(rows) // 10))
    assert all(convs["eval_ok"][i] for i in split["test"]["index"])
    assert sorted(list(split["train"]["index"]) + list(split["test"]["index"])) == list(range(len(rows)))
    assert list(held_out_split(rows, 4, seed=0)["test"]["index"]) == list(split["test"]["index"])  # seeded
    with pytest.raises(DataError, match="Every data source is marked `eval: false`"):
        held_out_split(rows.map(lambda ex: {"eval_ok": False}), 4, seed=0)
    # no source marked: the split is the plain seeded one of earlier releases
    plain = build_conversations([new], **kw)
    assert all(plain["eval_ok"])
    rows = Dataset.from_list([{"index": i, "eval_ok": True} for i in range(len(plain))])
    assert list(held_out_split(rows, 2, 0)["test"]["index"]) == list(rows.train_test_split(test_size=1, seed=0)["test"]["index"])


# ----------------------------------------------------------------------------------------------- vocabulary
def test_draft_vocabulary_is_the_most_frequent_loss_tokens():
    ds = Dataset.from_list(
        [
            {"input_ids": [5, 7, 7, 9, 3], "loss_mask": [0, 1, 1, 1, 0]},
            {"input_ids": [7, 9, 1, 1, 5], "loss_mask": [1, 1, 0, 1, 1]},
        ]
    )
    counts = token_counts(ds, vocab_size=12)
    assert counts.tolist() == [0, 1, 0, 0, 0, 1, 0, 3, 0, 2, 0, 0]
    ids, coverage = select_draft_vocab(counts, 3, always_include=[11])
    assert ids.tolist() == [7, 9, 11] and coverage == pytest.approx(5 / 7)
    ids, coverage = select_draft_vocab(counts, 4)
    assert ids.tolist() == [1, 5, 7, 9] and coverage == 1.0  # ties broken by id: deterministic
    assert select_draft_vocab(counts, 5, prefer=torch.tensor([10, 4]))[0].tolist() == [1, 4, 5, 7, 9]  # wins ties only
    assert select_draft_vocab(counts, 2, prefer=torch.tensor([1, 5]))[0].tolist() == [7, 9]
    assert coverage_table(counts, sizes=(1, 2, 12, 50)) == {1: 3 / 7, 2: 5 / 7, 12: 1.0}
    with pytest.raises(ValueError, match="must be in 1..12"):
        select_draft_vocab(counts, 13)

    target = make_tiny_target("llama")
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=4)
    draft.set_vocab_mapping(ids)
    assert draft.draft_to_target_ids(torch.arange(4)).tolist() == [1, 5, 7, 9]
    assert draft.t2d.nonzero().flatten().tolist() == [1, 5, 7, 9] and draft.t2d.numel() == 256


def test_a_new_vocabulary_keeps_the_rows_of_shared_tokens_and_maps_new_ones_from_the_target():
    torch.manual_seed(0)
    target = make_tiny_target("llama")  # vocabulary 256, hidden 64
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=120)
    old_ids = torch.arange(0, 240, 2)  # even ids
    draft.set_vocab_mapping(old_ids)
    head_t = target.get_output_embeddings().weight.detach()
    fit = torch.randn(64, 64)
    with torch.no_grad():  # a draft whose rows are a linear image of the target's: the map must be found again
        draft.lm_head.weight.copy_(head_t[old_ids] @ fit)
    aux = torch.randn(1, 5, 3 * 64)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        before = draft(input_ids=ids, target_hidden_states=aux).logits  # (1, 5, 120) over old_ids
    new_ids = torch.cat([torch.arange(0, 200, 2), torch.arange(1, 81, 2)]).sort().values  # 100 kept, 40 new, 20 dropped
    counts = remap_draft_vocab(draft, new_ids, head_t)
    assert counts == {"carried_over": 100, "new": 40, "dropped": 20}
    assert draft.config.draft_vocab_size == 140 and draft.lm_head.weight.shape == (140, 64)
    assert torch.equal(draft.draft_to_target_ids(torch.arange(140)), new_ids)
    assert draft.t2d.sum() == 140 and draft.t2d[new_ids].all()
    with torch.no_grad():
        after = draft(input_ids=ids, target_hidden_states=aux).logits
    shared_old = new_ids[new_ids % 2 == 0] // 2  # their old draft slots
    assert torch.allclose(after[..., new_ids % 2 == 0], before[..., shared_old], atol=1e-5)  # shared tokens unchanged
    assert torch.allclose(draft.lm_head.weight[new_ids % 2 == 1], head_t[new_ids[new_ids % 2 == 1]] @ fit, atol=1e-3)


# ----------------------------------------------------------------------------------------------- TTT
def tiny_draft(draft_vocab_size: int = 64, seed: int = 0) -> Eagle3DraftModel:
    target = make_tiny_target("llama")
    torch.manual_seed(seed)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=draft_vocab_size).float()
    draft.set_vocab_mapping(torch.randperm(256)[:draft_vocab_size].sort().values)
    with torch.no_grad():  # far from init: non-trivial attention and logits
        for name, p in draft.named_parameters():
            if name != "embed_tokens.weight" and p.dim() == 2:
                p.normal_(0, 0.3)
    return draft


@torch.no_grad()
def naive_step_logits(draft, aux, input_ids, ttt_steps) -> dict:
    """{(row, t, k): (Vd,) logits} of draft step k at position t, each computed on its own: the prefix 0..t
    run causally (step 0), then steps 1..k one token at a time on top of it, as at inference. So every query
    sees exactly the step-0 keys of positions <= t and the keys of its own steps 1..k (the diagonal)."""
    b, s = input_ids.shape
    logits = {}
    for i in range(b):
        for t in range(s - 1):
            cache = DynamicCache()
            out = draft(
                input_ids=input_ids[i : i + 1, 1 : t + 2],
                target_hidden_states=aux[i : i + 1, : t + 1],
                position_ids=torch.arange(t + 1)[None],
                cache=cache,
                use_cache=True,
            )
            logits[i, t, 0] = out.logits[0, -1]
            hidden = out.hidden_states[:, -1:]
            for k in range(1, ttt_steps):
                if t + 1 + k >= s:
                    break
                out = draft(
                    input_ids=input_ids[i : i + 1, t + 1 + k : t + 2 + k],
                    hidden_states=hidden,
                    position_ids=torch.tensor([[t + k]]),
                    cache=out.cache,
                    use_cache=True,
                )
                logits[i, t, k] = out.logits[0, -1]
                hidden = out.hidden_states
    return logits


def naive_ttt_loss(draft, step_logits, target_logits, loss_mask, attention_mask, ttt_steps, step_weight):
    """The objective written out position by position: soft CE against the target's distribution over the
    draft vocabulary, for tokens under the loss mask whose target argmax the draft vocabulary holds; the
    accuracy counts every token under the loss mask, one outside the draft vocabulary as a miss."""
    b, s, _ = target_logits.shape
    draft_ids = draft.draft_to_target_ids(torch.arange(draft.config.draft_vocab_size))
    sums, counts, correct, chain_correct = [0.0] * ttt_steps, [0] * ttt_steps, [0] * ttt_steps, [0] * ttt_steps
    loss_counts = [0] * ttt_steps
    for i in range(b):
        for t in range(s):
            chain = True
            for k in range(ttt_steps):
                token = t + 2 + k  # the token step k at position t predicts; the target's view of it is at token - 1
                if token >= s or not (loss_mask[i, token] and attention_mask[i, token]):
                    chain = False
                    continue
                counts[k] += 1
                if not draft.t2d[target_logits[i, token - 1].argmax()]:
                    chain = False
                    continue
                p = target_logits[i, token - 1, draft_ids].softmax(-1)
                logp = step_logits[i, t, k].log_softmax(-1)
                sums[k] += -(p * logp).sum().item()
                loss_counts[k] += 1
                hit = bool(logp.argmax() == p.argmax())
                correct[k] += hit
                chain = chain and hit
                chain_correct[k] += chain
    losses = [sums[k] / max(loss_counts[k], 1) for k in range(ttt_steps)]
    assert loss_counts != counts  # the case has targets outside the draft vocabulary
    return {
        "loss": sum(step_weight**k * l for k, l in enumerate(losses)),
        "step_losses": losses,
        "step_count": counts,
        "step_correct": correct,
        "chain_correct": chain_correct,
    }


def ttt_case(seed: int = 0):
    """A padded batch whose target logits agree with the draft at many positions (hits at steps 0 and 1),
    with positions whose target argmax lies outside the draft vocabulary."""
    b, s, K = 2, 11, 3
    draft = tiny_draft(seed=seed)
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 256, (b, s), generator=g)
    aux = torch.randn(b, s, 3 * 64, generator=g)
    attention_mask = torch.ones(b, s, dtype=torch.long)
    attention_mask[1, -3:] = 0
    loss_mask = (torch.rand(b, s, generator=g) > 0.2).long() * attention_mask
    step_logits = naive_step_logits(draft, aux, input_ids, K)
    draft_ids = draft.draft_to_target_ids(torch.arange(64))
    target_logits = torch.randn(b, s, 256, generator=g)
    for i in range(b):
        for r in range(1, s):  # row r is the target's view of token r + 1
            src = (i, r - 1, 0) if r % 2 == 0 else (i, r - 2, 1)
            if src in step_logits:
                target_logits[i, r, draft_ids] = step_logits[src] * 4
    outside = (~draft.t2d).nonzero()[0].item()
    target_logits[0, 3, outside] = target_logits[0, 6, outside] = 1e3
    return draft, aux, input_ids, target_logits, loss_mask, attention_mask, K, step_logits


@pytest.mark.parametrize("arch", ["llama", "gemma2", "qwen3"])
def test_head_from_target_reproduces_the_target_logits_of_the_draft_vocabulary(arch):
    """draft.head_from_target: lm_head(norm(h)) of the fresh draft = the target's logits of the draft's tokens
    (Gemma's final norm scales by 1 + w, Llama's by w; soft-capping aside)."""
    from eagle3_hub.training.models import init_head_from_target

    target = make_tiny_target(arch)
    with torch.no_grad():
        target.get_decoder().norm.weight.uniform_(0.5, 1.5)  # a non-trivial gain
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    ids = torch.randperm(target.config.vocab_size)[:64].sort().values
    draft.set_vocab_mapping(ids)
    init_head_from_target(draft, target)
    h = torch.randn(3, target.config.hidden_size)
    want = target.get_output_embeddings()(target.get_decoder().norm(h))[:, ids]
    torch.testing.assert_close(draft.lm_head(draft.norm(h)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_layer_from_target_reproduces_the_target_layer_when_both_inputs_are_its_input(arch):
    """draft.layer_from_target: with the layer's input on both sides (embedding and feature), the fresh draft's
    layer gives the target layer's output; fc passes the last aux feature through. Gemma's layer is refused."""
    from eagle3_hub.training.models import init_layer_from_target

    target = make_tiny_target(arch)
    with torch.no_grad():
        for norm in (target.get_decoder().layers[1].input_layernorm, target.get_decoder().layers[1].post_attention_layernorm):
            norm.weight.uniform_(0.5, 1.5)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64)
    if arch == "qwen2":  # biased q/k/v: the draft must have them too
        with pytest.raises(ValueError, match="set draft.attention_bias: true"):
            init_layer_from_target(draft, target, 1)
        draft = Eagle3DraftModel.from_target(target, draft_vocab_size=64, attention_bias=True)
    init_layer_from_target(draft, target, 1)
    ids = torch.randint(3, 256, (2, 9))
    hs = target(ids, output_hidden_states=True).hidden_states  # hs[i] = the input of layer i
    position_ids = torch.arange(9)[None].expand(2, -1)
    out = draft.midlayer(hs[1], hs[1], draft.rotary_emb(hs[1], position_ids))
    torch.testing.assert_close(out, hs[2], rtol=1e-4, atol=1e-4)
    aux = torch.randn(2, 9, 3 * target.config.hidden_size)
    torch.testing.assert_close(draft.fuse(aux), aux[..., 2 * target.config.hidden_size :])
    with pytest.raises(ValueError, match="layer_from_target=5: the target has"):
        init_layer_from_target(draft, target, 5)
    gemma = make_tiny_target("gemma2")
    with pytest.raises(ValueError, match="not a Llama-shaped layer"):
        init_layer_from_target(Eagle3DraftModel.from_target(gemma, draft_vocab_size=64), gemma, 0)


def test_ttt_loss_matches_a_naive_step_by_step_reference():
    draft, aux, ids, target_logits, loss_mask, att, K, step_logits = ttt_case()
    ref = naive_ttt_loss(draft, step_logits, target_logits, loss_mask, att, K, 0.8)
    with torch.no_grad():
        out = ttt_loss(draft, aux, ids, target_logits, loss_mask, att, ttt_steps=K, step_weight=0.8)
    assert out.step_count.tolist() == ref["step_count"] and min(ref["step_count"]) > 3
    assert out.step_correct.tolist() == ref["step_correct"] and ref["step_correct"][0] > 3 and ref["step_correct"][1] > 0
    assert out.chain_correct.tolist() == ref["chain_correct"] and ref["chain_correct"][1] > 0
    torch.testing.assert_close(out.step_losses, torch.tensor(ref["step_losses"]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, torch.tensor(ref["loss"]), rtol=1e-5, atol=1e-5)
    # with the mask changed at one position, both agree again (the reference is not matched by construction)
    loss_mask[0, 5] = 1 - loss_mask[0, 5]
    ref2 = naive_ttt_loss(draft, step_logits, target_logits, loss_mask, att, K, 0.8)
    with torch.no_grad():
        out2 = ttt_loss(draft, aux, ids, target_logits, loss_mask, att, ttt_steps=K, step_weight=0.8)
    assert out2.step_count.tolist() == ref2["step_count"] != ref["step_count"]
    torch.testing.assert_close(out2.loss, torch.tensor(ref2["loss"]), rtol=1e-5, atol=1e-5)

    m = acceptance_metrics(out.step_correct, out.step_count, out.chain_correct, out.chain_count)
    chain = [c / ref["step_count"][0] for c in ref["chain_correct"]]
    assert m["chain_acceptance"] == pytest.approx(chain) and m["expected_acceptance_length"] == pytest.approx(1 + sum(chain))


def _padded_batch(target, seed: int, shape: tuple[int, int], padding: int, first_scored: int):
    """Random token ids, the last row right-padded by ``padding``, tokens from ``first_scored`` on scored."""
    ids = torch.randint(3, target.config.vocab_size, shape, generator=torch.Generator().manual_seed(seed))
    att = torch.ones_like(ids)
    att[-1, -padding:] = 0
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, first_scored:] = 1
    return ids, att, loss_mask & att


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_target_logits_only_where_the_loss_reads_them(arch):
    """aux_features(logits_at=...) runs the target's output layer on the rows the TTT loss reads (the one before
    each scored token), with Gemma's soft-capping; the loss is unchanged."""
    target = make_tiny_target(arch)
    ids, att, loss_mask = _padded_batch(target, seed=0, shape=(2, 9), padding=2, first_scored=4)
    at = target_logit_positions(loss_mask)
    assert at[0].tolist() == [False] * 3 + [True] * 5 + [False] and at[1].tolist() == [False] * 3 + [True] * 3 + [False] * 3
    aux, full = aux_features(target, ids, att, [0, 1, 2])
    aux_at, part = aux_features(target, ids, att, [0, 1, 2], logits_at=at)
    torch.testing.assert_close(aux_at, aux)
    torch.testing.assert_close(part[at], full[at], rtol=1e-5, atol=1e-5)
    assert (part[~at] == 0).all()
    draft = Eagle3DraftModel.from_target(target, aux_layer_ids=[0, 1, 2], draft_vocab_size=64)
    draft.set_vocab_mapping(torch.arange(64))
    with torch.no_grad():
        a = ttt_loss(draft, aux, ids, full, loss_mask, att, ttt_steps=3)
        b = ttt_loss(draft, aux, ids, part, loss_mask, att, ttt_steps=3)
    torch.testing.assert_close(a.loss, b.loss)
    assert a.step_count.tolist() == b.step_count.tolist() and a.step_count[0] > 0


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_target_scores_give_the_loss_of_full_logits_without_a_vocabulary_sized_tensor(arch, monkeypatch):
    """With the draft vocabulary's ids, the target's logits reach the loss as TargetScores (the draft columns, and of
    the full vocabulary the argmax and log-sum-exp), computed a few rows at a time: the same loss and counts as full
    logits, and no (b, s, V) tensor (a 262k-token target's would take gigabytes per batch)."""
    from eagle3_hub.training import features as features_module
    from eagle3_hub.training.ttt import TargetScores, draft_token_ids

    target = make_tiny_target(arch)
    ids, att, loss_mask = _padded_batch(target, seed=1, shape=(3, 11), padding=3, first_scored=3)
    at = target_logit_positions(loss_mask)
    draft = Eagle3DraftModel.from_target(target, aux_layer_ids=[0, 1, 2], draft_vocab_size=64)
    draft.set_vocab_mapping(torch.arange(0, 128, 2))  # every other token: some targets' choices fall outside
    monkeypatch.setattr(features_module, "SCORE_CHUNK_ROWS", 5)  # several chunks
    aux, full = aux_features(target, ids, att, [0, 1, 2], logits_at=at)
    _, scores = aux_features(target, ids, att, [0, 1, 2], logits_at=at, draft_ids=draft_token_ids(draft))
    assert isinstance(scores, TargetScores) and scores.draft.shape == (3, 11, 64)
    assert scores.argmax[at].tolist() == full[at].argmax(-1).tolist()
    torch.testing.assert_close(scores.lse[at], full[at].float().logsumexp(-1))
    with torch.no_grad():
        a = ttt_loss(draft, aux, ids, full, loss_mask, att, ttt_steps=3, loss={"kl": 0.5, "lk": 0.5})
        b = ttt_loss(draft, aux, ids, scores, loss_mask, att, ttt_steps=3, loss={"kl": 0.5, "lk": 0.5})
    torch.testing.assert_close(a.loss, b.loss)
    assert a.step_count.tolist() == b.step_count.tolist() and a.step_trained.tolist() == b.step_trained.tolist()


def test_length_grouped_batches_cover_every_sample_once_with_less_padding():
    lengths = torch.randint(10, 400, (1000,), generator=torch.Generator().manual_seed(0)).tolist()

    def epoch(seed):
        return list(LengthGroupedBatches(lengths, 4, torch.Generator().manual_seed(seed)))

    batches = epoch(0)
    assert len(batches) == len(LengthGroupedBatches(lengths, 4, torch.Generator())) == 250
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert epoch(0) == batches and epoch(1) != batches  # a function of the generator's state
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    random_batches = torch.randperm(1000, generator=torch.Generator().manual_seed(0)).view(-1, 4).tolist()
    padded_random = sum(max(lengths[i] for i in b) * len(b) for b in random_batches)
    assert padded < 0.8 * padded_random and padded < 1.05 * sum(lengths)
    firsts = [min(b) for b in batches[:20]]
    assert firsts != sorted(firsts)  # the batches come in random order, not longest first


def test_gradient_checkpointing_gives_the_same_loss_and_gradients():
    draft, aux, ids, target_logits, loss_mask, att, K, _ = ttt_case(seed=1)
    draft.train()
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            draft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        draft.zero_grad()
        out = ttt_loss(draft, aux, ids, target_logits, loss_mask, att, ttt_steps=K)
        out.loss.backward()
        grads.append((out.loss.detach(), {n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None}))
    (l0, g0), (l1, g1) = grads
    assert draft.gradient_checkpointing and g0.keys() == g1.keys() and "midlayer.self_attn.q_proj.weight" in g0
    torch.testing.assert_close(l0, l1)
    for name in g0:
        torch.testing.assert_close(g0[name], g1[name], rtol=1e-5, atol=1e-6)


def test_bf16_autocast_gives_the_float32_loss_and_gradients_up_to_rounding():
    """train.mixed_precision bf16 (auto on GPUs and on CPUs with bf16 units): the TTT step runs under autocast on
    the CPU and its loss and gradients stay close to float32's; auto resolves by the device."""
    draft, aux, ids, target_logits, loss_mask, att, K, _ = ttt_case(seed=2)
    draft.train()
    runs = []
    for ctx in (torch.autocast("cpu", enabled=False), torch.autocast("cpu", dtype=torch.bfloat16)):
        draft.zero_grad()
        with ctx:
            out = ttt_loss(draft, aux, ids, target_logits, loss_mask, att, ttt_steps=K)
        out.loss.backward()
        runs.append((out.loss.detach(), torch.cat([p.grad.flatten() for p in draft.parameters() if p.grad is not None])))
    (l32, g32), (l16, g16) = runs
    assert l16.dtype == torch.float32 and torch.isfinite(g16).all()
    assert not torch.equal(g32, g16)  # autocast did run in bf16
    assert abs(l16 - l32) < 0.02 * abs(l32)
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0) > 0.99
    assert resolve_mixed_precision("no") == "no" and resolve_mixed_precision("fp16") == "fp16"
    if not torch.cuda.is_available():
        assert resolve_mixed_precision("auto") == ("bf16" if cpu_has_bf16_units() else "no")


# ----------------------------------------------------------------------------------------------- end to end
def test_end_to_end_tiny_run_writes_a_loadable_draft_with_metrics_and_card(trained, tiny_target_dir):
    recipe, out = trained
    work = Path(recipe["work_dir"])
    assert out == Path(recipe["output_dir"]) == work / "draft"
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "training_metrics.json", "README.md", "modeling_eagle3.py"} <= files
    assert not any(n.startswith(".tmp") for n in os.listdir(work))
    metrics = json.loads((out / "training_metrics.json").read_text())
    acc = metrics["acceptance"]
    assert acc["step"] == 30 and len(acc["step_accuracy"]) == len(acc["chain_acceptance"]) == 3
    assert acc["expected_acceptance_length"] == pytest.approx(1 + sum(acc["chain_acceptance"]))
    assert metrics["wall_time_s"] > 0 and metrics["steps"] == 30
    assert metrics["vocab"]["coverage"] > 0.99  # regenerated answers: the target's own tokens
    assert metrics["data"]["train"] + metrics["data"]["eval"] == 40
    history = metrics["eval_history"]
    assert [h["step"] for h in history] == [10, 20, 30] and history[-1]["loss"] < history[0]["loss"]
    assert json.loads((work / "eval_metrics.json").read_text())["eval_history"] == history
    assert any((work / "tensorboard").rglob("events.out.tfevents.*"))
    assert "expected acceptance length" in (out / "README.md").read_text()
    # the draft: bf16 weights without the target's embedding, loadable next to its target
    weights = load_file(out / "model.safetensors")
    assert "embed_tokens.weight" not in weights and weights["fc.weight"].dtype == torch.bfloat16
    target, _ = load_target(str(tiny_target_dir))
    draft = Eagle3DraftModel.from_pretrained(out, target=target, dtype=torch.float32)
    vocab = json.loads((work / "vocab.json").read_text())
    assert draft.draft_to_target_ids(torch.arange(256)).tolist() == vocab["target_ids"]
    ids = torch.tensor([[1, 2, 3, 4]])
    aux, _ = aux_features(target, ids, torch.ones_like(ids), draft.config.aux_layer_ids)
    assert draft(input_ids=ids, target_hidden_states=aux).logits.shape == (1, 4, 256)


def test_held_out_evaluations_score_at_eval_ttt_steps(tmp_path, tiny_target_dir, data_dir):
    """A draft trained with a 1-step unroll is scored at 3 (``train.eval_ttt_steps``), as 3-step drafts are."""
    recipe = recipe_for(
        tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], train={"ttt_steps": 1, "eval_ttt_steps": 3, "max_steps": 3}
    )
    out = train(recipe)
    metrics = json.loads((out / "training_metrics.json").read_text())
    assert [len(h["step_accuracy"]) for h in metrics["eval_history"]] == [3]
    assert len(metrics["acceptance"]["chain_acceptance"]) == 3
    assert metrics["recipe"]["train"]["ttt_steps"] == 1


def test_resume_after_sigkill_ends_where_an_uninterrupted_run_ends(tmp_path, tiny_target_dir, data_dir):
    """Batch 3 and grad_accum 2 over 36 samples: epochs of 6 steps. The kill comes after the checkpoint of step
    8, in the middle of the second epoch, so the resumed run must rebuild that epoch's shuffle and skip its
    first batches, then cross into the third epoch."""
    common = dict(
        data={"regenerate": True, "max_new_tokens": 12},  # the target's own tokens: a non-zero loss
        train={"max_steps": 14, "batch_size": 3, "grad_accum": 2, "save_every": 4, "eval_every": 5},
    )
    full = recipe_for(tmp_path / "a", tiny_target_dir, [data_dir / "sharegpt.jsonl"], **common)
    killed = recipe_for(tmp_path / "b", tiny_target_dir, [data_dir / "sharegpt.jsonl"], **common)
    config = write_recipe(tmp_path / "b.yaml", killed)
    log = open(tmp_path / "killed.log", "w")  # noqa: SIM115 (open while the process runs) a file, not a pipe: progress bars must never block the run
    proc = subprocess.Popen(
        [sys.executable, "-m", "eagle3_hub.commands.train", "--config", str(config)],
        env=ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    ckpts = Path(killed["work_dir"]) / "checkpoints"
    deadline = time.time() + 120
    while not (ckpts / "step-8").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, f"the run ended before it could be killed: {(tmp_path / 'killed.log').read_text()[-3000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    log.close()
    done = sorted(int(p.name.split("-")[1]) for p in ckpts.glob("step-*"))
    assert max(done) >= 8 and 14 not in done and not (Path(killed["output_dir"]) / "config.json").exists()
    (ckpts / ".tmp-step-99").mkdir()  # a checkpoint whose writing was killed: ignored, then removed
    (ckpts / ".tmp-step-99" / "trainer_state.json").write_text("{}")

    train(killed, resume=True)
    train(full)
    assert not (ckpts / ".tmp-step-99").exists()
    a = load_file(Path(full["work_dir"]) / "checkpoints" / "step-14" / "model.safetensors")
    b = load_file(ckpts / "step-14" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    before = load_file(ckpts / "step-12" / "model.safetensors")  # (kept: the last two) training did move the weights
    assert not torch.equal(before["midlayer.mlp.down_proj.weight"], b["midlayer.mlp.down_proj.weight"])
    ma = json.loads((Path(full["output_dir"]) / "training_metrics.json").read_text())
    mb = json.loads((Path(killed["output_dir"]) / "training_metrics.json").read_text())
    assert ma["eval_history"] == mb["eval_history"] and [h["step"] for h in ma["eval_history"]] == [5, 10, 14]
    assert all(h["loss"] > 0 for h in ma["eval_history"])
    assert mb["wall_time_s"] > 0
    # a resume of a finished run writes the same draft again
    train(killed, resume=True)
    c = load_file(Path(killed["output_dir"]) / "model.safetensors")
    assert all(torch.equal(c[k], load_file(Path(full["output_dir"]) / "model.safetensors")[k]) for k in c)


def test_stages_train_in_one_command_and_a_resumed_chain_skips_the_finished_ones(tmp_path, tiny_target_dir, data_dir, capsys):
    short = {"max_steps": 2, "eval_every": 2, "save_every": 2}
    first = recipe_for(tmp_path / "one", tiny_target_dir, [data_dir / "sharegpt.jsonl"], train=short)
    second = recipe_for(
        tmp_path / "two",
        tiny_target_dir,
        [data_dir / "ultrachat.parquet"],
        train=short,
        draft={"init_from": first["output_dir"], "draft_vocab_size": None},
    )
    first["stages"] = [str(write_recipe(tmp_path / "two.yaml", second))]
    config = write_recipe(tmp_path / "one.yaml", first)
    assert run_cli(config, "--train.lr", "0.002") == 0  # an override reaches every stage
    out = capsys.readouterr().out
    assert "[stages] stage 1/2" in out and "[stages] stage 2/2" in out
    one, two = Path(first["output_dir"]), Path(second["output_dir"])
    metrics = json.loads((two / "training_metrics.json").read_text())
    (lineage,) = metrics["earlier_stages"]  # stage 2 continued stage 1's draft
    assert lineage["steps"] == 2 and metrics["recipe"]["train"]["lr"] == 0.002
    assert json.loads((Path(first["work_dir"]) / "finished.json").read_text())["output_dir"] == str(one)

    # stage 2 interrupted: --resume skips stage 1 (its draft untouched) and finishes stage 2
    (Path(second["work_dir"]) / "finished.json").unlink()
    (two / "model.safetensors").unlink()
    before = (one / "model.safetensors").stat().st_mtime_ns
    # a resume with another recipe (the override left out) is another run: refused, nothing trained
    assert run_cli(config, resume=True) == 2
    assert "holds checkpoints of another run (its recipe differs: train.lr 0.002 -> 0.0005)" in capsys.readouterr().err
    assert run_cli(config, "--train.lr", "0.002", resume=True) == 0
    out = capsys.readouterr().out
    assert "one.yaml finished earlier" in out and "two.yaml finished earlier" not in out
    assert (one / "model.safetensors").stat().st_mtime_ns == before
    assert (two / "model.safetensors").exists() and (Path(second["work_dir"]) / "finished.json").exists()


def test_lora_mode_saves_an_adapter_loadable_as_a_peft_model_of_the_draft(tmp_path, trained, tiny_target_dir, data_dir):
    from peft import PeftModel

    _, base_dir = trained
    recipe = recipe_for(
        tmp_path,
        tiny_target_dir,
        [data_dir / "sharegpt.jsonl"],
        data={"regenerate": True, "max_new_tokens": 16},
        draft={"init_from": str(base_dir), "draft_vocab_size": None},
        lora={"enabled": True, "r": 4, "alpha": 8},
        train={"max_steps": 4, "lr": 1e-2, "gradient_checkpointing": True},
    )
    out = train(recipe)
    files = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "training_metrics.json"} <= files
    assert "model.safetensors" not in files
    adapter = load_file(out / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    metrics = json.loads((out / "training_metrics.json").read_text())
    assert metrics["vocab"]["from_draft"] and metrics["vocab"]["draft_vocab_size"] == 256
    base_metrics = json.loads((base_dir / "training_metrics.json").read_text())
    (stage,) = metrics["earlier_stages"]  # the lineage: the run that trained init_from
    assert stage["steps"] == base_metrics["steps"] > 0 and stage["training_samples"] == base_metrics["data"]["train"]
    # the draft it continued is scored on this run's held-out split first, then the trained one
    assert [h["step"] for h in metrics["eval_history"]] == [0, 3, 4]

    target, _ = load_target(str(tiny_target_dir))
    base = Eagle3DraftModel.from_pretrained(base_dir, target=target, dtype=torch.float32)
    model = PeftModel.from_pretrained(Eagle3DraftModel.from_pretrained(base_dir, target=target, dtype=torch.float32), out)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    aux, _ = aux_features(target, ids, torch.ones_like(ids), base.config.aux_layer_ids)
    with torch.no_grad():
        plain = base(input_ids=ids, target_hidden_states=aux).logits
        adapted = model(input_ids=ids, target_hidden_states=aux).logits
    assert plain.shape == adapted.shape and not torch.allclose(plain, adapted)  # trained adapters change the draft
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)


def test_a_continued_draft_can_take_a_new_vocabulary_from_the_data(tmp_path, trained, tiny_target_dir, data_dir):
    _, base_dir = trained
    recipe = recipe_for(
        tmp_path,
        tiny_target_dir,
        [data_dir / "sharegpt.jsonl"],
        draft={"init_from": str(base_dir), "draft_vocab_size": 320, "reselect_vocab": True},
        train={"max_steps": 2, "eval_every": 2, "save_every": 2},
    )
    out = train(recipe)
    after_training(recipe, out)  # the card, as `eagle3-hub train` writes it
    metrics = json.loads((out / "training_metrics.json").read_text())
    vocab = metrics["vocab"]
    assert not vocab["from_draft"] and vocab["draft_vocab_size"] == 320
    assert vocab["remap"]["carried_over"] + vocab["remap"]["new"] == 320
    assert vocab["coverage"] >= vocab["init_from_coverage"]
    target, _ = load_target(str(tiny_target_dir))
    base = Eagle3DraftModel.from_pretrained(base_dir, target=target, dtype=torch.float32)
    draft = Eagle3DraftModel.from_pretrained(out, target=target, dtype=torch.float32)
    assert draft.config.draft_vocab_size == 320
    new_ids = draft.draft_to_target_ids(torch.arange(320))
    saved = json.loads((Path(recipe["work_dir"]) / "vocab.json").read_text())
    assert torch.equal(new_ids, torch.tensor(saved["target_ids"]))
    base_ids = base.draft_to_target_ids(torch.arange(base.config.draft_vocab_size))
    assert vocab["remap"]["carried_over"] == int(torch.isin(base_ids, new_ids).sum())
    assert [h["step"] for h in metrics["eval_history"]] == [0, 2]  # the continued draft scored first
    assert f"{vocab['remap']['carried_over']} rows carried over" in (out / "README.md").read_text()  # the card says so


def test_offline_features_match_online_and_train(tmp_path, tiny_target_dir, data_dir, monkeypatch):
    recipe = recipe_for(
        tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], features={"mode": "offline"}, train={"max_steps": 3}
    )
    out = train(recipe)
    cache = Path(recipe["work_dir"]) / "features"
    shards = sorted(p.name for p in cache.glob("*.safetensors"))
    assert shards == ["split0-00000.safetensors", "split1-00000.safetensors"] and (out / "model.safetensors").exists()

    from accelerate import Accelerator
    from datasets import load_from_disk

    target, tok = load_target(str(tiny_target_dir))
    splits = load_from_disk(str(Path(recipe["work_dir"]) / "data" / "tokenized"))
    feats = OfflineFeatures(recipe, target, [0, 1, 2], Accelerator())
    on_disk = sum((cache / s).stat().st_size for s in shards)
    assert 0.95 < on_disk / feats.estimate_bytes([splits["train"], splits["test"]]) < 1.1
    batch = collate([splits["train"][i] for i in range(4)], tok.pad_token_id)
    aux_off, logits_off = feats.load(batch)
    aux_on, logits_on = aux_features(target, batch["input_ids"], batch["attention_mask"], [0, 1, 2])
    real = batch["attention_mask"].bool()
    assert aux_off.dtype == torch.bfloat16
    torch.testing.assert_close(aux_off.float()[real], aux_on[real], rtol=2**-7, atol=1e-5)
    # logits from the bf16 final hidden state: within the bf16 rounding of that state, propagated by lm_head
    last = target.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    bound = last.abs() @ target.lm_head.weight.abs().T * 2**-8 + 1e-4
    assert ((logits_off - logits_on).abs() <= bound)[real].all()
    assert (logits_off.argmax(-1) == logits_on.argmax(-1))[real].float().mean() > 0.95

    # the build resumes shard by shard, and stops before it starts when the disk is too small
    first = cache / shards[0]
    mtime = (cache / shards[1]).stat().st_mtime_ns
    first.unlink()
    feats.build([splits["train"], splits["test"]], tok.pad_token_id)
    assert first.exists() and (cache / shards[1]).stat().st_mtime_ns == mtime
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(features_module.shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    small = OfflineFeatures(
        recipe_for(tmp_path / "x", tiny_target_dir, [], features={"cache_dir": str(tmp_path / "small")}),
        target,
        [0, 1, 2],
        Accelerator(),
    )
    with pytest.raises(OSError, match="GiB free"):
        small.build([splits["train"]], tok.pad_token_id)
    assert not (tmp_path / "small").exists()
    with pytest.raises(ValueError, match="other aux_layer_ids"):  # a cache built for other layers is not reused
        OfflineFeatures(recipe, target, [0, 1, 1], Accelerator()).build([splits["train"], splits["test"]], tok.pad_token_id)


def test_offline_features_are_reused_from_an_earlier_run(tmp_path, tiny_target_dir, data_dir, capsys):
    """A later stage that keeps an earlier run's data copies those samples' features and runs the target on its
    new samples only; a folder that is no such run, or a run for other layers, is refused."""
    from accelerate import Accelerator
    from datasets import load_from_disk

    first = recipe_for(
        tmp_path / "a", tiny_target_dir, [data_dir / "sharegpt.jsonl"], features={"mode": "offline"}, train={"max_steps": 1}
    )
    train(first)
    second = recipe_for(
        tmp_path / "b",
        tiny_target_dir,
        [data_dir / "sharegpt.jsonl", data_dir / "ultrachat.parquet"],
        features={"mode": "offline", "reuse_from": [first["work_dir"]]},
        train={"max_steps": 1},
    )
    train(second)
    assert "[features] 40 samples' features taken from" in capsys.readouterr().out

    def samples(recipe):
        splits = load_from_disk(str(Path(recipe["work_dir"]) / "data" / "tokenized"))
        return splits, {sample_key(ids): i for s in splits.values() for i, ids in zip(s["index"], s["input_ids"])}

    (_, old), (splits, new) = samples(first), samples(second)
    shared = [(new[k], old[k]) for k in new if k in old]
    assert len(old) == 40 and len(new) == 52 and len(shared) == 40
    a, b = ShardReader(Path(first["work_dir"]) / "features"), ShardReader(Path(second["work_dir"]) / "features")
    for i, j in shared:
        assert torch.equal(b.get(f"aux.{i}"), a.get(f"aux.{j}")) and torch.equal(b.get(f"last.{i}"), a.get(f"last.{j}"))

    # rebuilt with the target's forwards counted: only the 12 new samples pass through it, and their features are
    # the target's (as the online path computes them)
    cache = Path(second["work_dir"]) / "features"
    for shard in cache.glob("*.safetensors"):
        shard.unlink()
    target, tok = load_target(str(tiny_target_dir))
    rows, forward = [], target.forward
    target.forward = lambda **kw: rows.append(kw["input_ids"].shape[0]) or forward(**kw)
    OfflineFeatures(second, target, [0, 1, 2], Accelerator()).build([splits["train"], splits["test"]], tok.pad_token_id)
    target.forward = forward
    assert sum(rows) == 12
    fresh = ShardReader(cache)
    reused = {i for i, _ in shared}
    for split in splits.values():
        for i, ids in zip(split["index"], split["input_ids"]):
            if i not in reused:
                aux, _ = aux_features(target, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), [0, 1, 2])
                torch.testing.assert_close(fresh.get(f"aux.{i}").float(), aux[0], rtol=2**-7, atol=1e-5)

    # a run that is not on this machine (a fresh clone): its samples are computed
    capsys.readouterr()
    absent = {"mode": "offline", "cache_dir": str(tmp_path / "e"), "reuse_from": [str(tmp_path / "gone")]}
    OfflineFeatures({**second, "features": absent}, target, [0, 1, 2], Accelerator()).build([splits["test"]], tok.pad_token_id)
    assert "gone not found: its samples' features are computed" in capsys.readouterr().out
    assert len(list((tmp_path / "e").glob("*.safetensors"))) == 1
    # bad entries: a folder that is no offline-features run, a run built for other aux layers
    elsewhere = {"mode": "offline", "cache_dir": str(tmp_path / "c"), "reuse_from": [str(tmp_path)]}
    with pytest.raises(FileNotFoundError, match="is not the work_dir of an offline-features run"):
        OfflineFeatures({**second, "features": elsewhere}, target, [0, 1, 2], Accelerator()).build(
            [splits["train"]], tok.pad_token_id
        )
    other = {**elsewhere, "cache_dir": str(tmp_path / "d"), "reuse_from": [first["work_dir"]]}
    with pytest.raises(ValueError, match="reuse_from: .* was built with other aux_layer_ids"):
        OfflineFeatures({**second, "features": other}, target, [0, 1, 1], Accelerator()).build(
            [splits["train"]], tok.pad_token_id
        )


def _torchrun_two(config: Path, outputs: list[Path], timeout: int = 150, tries: int = 2):
    """`torchrun --nproc_per_node 2` of `eagle3-hub train`. Under a loaded machine the two gloo processes have hung,
    rarely, after the data and vocabulary were ready (alone the run takes about 10 s): a run past ``timeout`` has its
    training processes print their Python stacks (faulthandler, on SIGABRT), is killed whole (torchrun starts them in
    sessions of their own, out of reach of the launcher's group) and is retried once from scratch. A run that hung
    once shows its stacks in pytest's warnings summary; a second hang fails the test with both runs' output."""
    seen = []
    for _ in range(tries):
        for out in outputs:
            shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2",
                "-m",
                "eagle3_hub.commands.train",
                "--config",
                str(config),
            ],
            env={**ENV, "ACCELERATE_USE_CPU": "true", "PYTHONFAULTHANDLER": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            if seen:
                warnings.warn(f"torchrun hung past {timeout} s once, then ran; the hung run's output:\n{seen[0]}", stacklevel=2)
            return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        except subprocess.TimeoutExpired:
            workers = []
            with contextlib.suppress(psutil.NoSuchProcess):  # a process may end while it is being signalled
                launcher = psutil.Process(proc.pid)
                launcher.suspend()  # else, once one worker dies, it kills the other before that one's stacks print
                workers = launcher.children(recursive=True)
                for w in workers:  # one at a time, so that the stacks do not interleave
                    w.send_signal(signal.SIGABRT)  # its faulthandler prints where each thread waits
                    psutil.wait_procs([w], timeout=10)
            for pid in [proc.pid, *(w.pid for w in workers)]:  # the pipes close only when every holder is gone
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            seen.append(stdout[-2000:] + stderr[-24000:])  # the stacks are at the end of stderr
    pytest.fail(f"torchrun hung past {timeout} s in all {tries} runs; their last output:\n" + "\n---\n".join(seen))


def test_data_parallel_run_on_two_cpu_processes(tmp_path, tiny_target_dir, data_dir):
    """`torchrun --nproc_per_node 2` (gloo): each process sees half of every epoch, checkpoints hold both
    processes' RNG states, and one draft folder comes out."""
    recipe = recipe_for(
        tmp_path,
        tiny_target_dir,
        [data_dir / "sharegpt.jsonl"],
        train={"max_steps": None, "epochs": 1, "save_every": 4, "eval_every": 4},
    )
    config = write_recipe(tmp_path / "recipe.yaml", recipe)
    proc = _torchrun_two(config, [Path(recipe["work_dir"]), Path(recipe["output_dir"])])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    last = Path(recipe["work_dir"]) / "checkpoints" / "step-5"  # 36 samples / 2 processes / batch 4: 5 steps
    assert json.loads((last / "trainer_state.json").read_text())["step"] == 5
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in last.iterdir()}
    metrics = json.loads((Path(recipe["output_dir"]) / "training_metrics.json").read_text())
    assert metrics["steps"] == 5 and [h["step"] for h in metrics["eval_history"]] == [4, 5]
    assert (proc.stdout + proc.stderr).count("[vocab]") == 1


def test_a_peft_adapter_target_is_merged_into_its_base(tmp_path, tiny_target_dir, data_dir, smollm2_tokenizer):
    """A fine-tuned target given as a PEFT adapter (base + adapter, merged at load), by folder alone or as
    target.adapter next to target.name."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32)
    tuned = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False))
    adapter_dir = tmp_path / "adapter"
    tuned.save_pretrained(adapter_dir)
    smollm2_tokenizer.save_pretrained(adapter_dir)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    plain = load_target(str(tiny_target_dir))[0](ids).logits
    merged = load_target(str(tiny_target_dir), adapter=str(adapter_dir))[0](ids).logits
    torch.testing.assert_close(load_target(str(adapter_dir))[0](ids).logits, merged)
    assert not torch.allclose(plain, merged, atol=1e-3)
    recipe = recipe_for(tmp_path, adapter_dir, [data_dir / "sharegpt.jsonl"], train={"max_steps": 2})
    out = train(recipe)
    assert json.loads((out / "training_metrics.json").read_text())["recipe"]["target"]["name"] == str(adapter_dir)
    assert Eagle3DraftModel.from_pretrained(out, target=load_target(str(adapter_dir))[0]).config.vocab_size == len(
        smollm2_tokenizer
    )


# ----------------------------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def no_template_target(tmp_path_factory, tiny_target_dir, smollm2_tokenizer):
    folder = tmp_path_factory.mktemp("no_template")
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        os.symlink(tiny_target_dir / name, folder / name)
    tok = AutoTokenizer.from_pretrained(tiny_target_dir)
    tok.chat_template = None
    tok.save_pretrained(folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    return folder


@pytest.fixture(scope="module")
def foreign_draft(tmp_path_factory):
    folder = tmp_path_factory.mktemp("foreign_draft")
    Eagle3DraftModel.from_target(make_tiny_target("llama")).save_pretrained(folder)  # vocabulary of 256
    return folder


@pytest.mark.parametrize(
    "case, message",
    [
        ("empty", "empty.jsonl: the dataset is empty"),
        ("malformed", "Could not load the local file .*bad.jsonl.*JSON parse error"),
        ("unusable", "no usable sample"),
        ("no_data", "No data"),
        ("no_template", "has no chat template"),
        ("vocab_too_large", r"draft_vocab_size=100000 must be in 1\.\.49152"),
        ("aux_out_of_range", r"aux_layer_ids \[0, 1, 7\] out of range.*3 decoder layers"),
        ("lora_without_draft", "lora.enabled adapts an existing draft"),
        ("foreign_draft", "does not fit|vocabulary of 256"),
        ("unknown_key", "Unknown recipe key `train.learning_rate`"),
        ("zero_steps", r"train\.ttt_steps=0"),
        ("openers_not_a_list", "data.synthesize_openers must be a list of strings"),
        ("eval_not_a_bool", r"data.sources\[0\].eval must be true or false \(default true\), got \"no\""),
        ("reselect_without_draft", "draft.reselect_vocab chooses a new vocabulary for the draft of draft.init_from"),
        ("reselect_not_a_bool", "draft.reselect_vocab must be true or false"),
        ("reuse_not_a_list", "features.reuse_from must be a list of earlier runs' work_dirs"),
        ("reuse_online", "features.reuse_from copies offline features: set features.mode: offline"),
        ("stage_missing", "stage 2 recipe nowhere.yaml not found"),
        ("stage_not_continuing", "stage 2 recipe .*later.yaml must continue the draft of stage 1"),
        ("stage_same_work_dir", "stage 2 recipe .*later.yaml has the work_dir of stage 1"),
    ],
)
def test_bad_input_fails_clearly_and_writes_nothing(
    case, message, tmp_path, tiny_target_dir, data_dir, no_template_target, foreign_draft, capsys
):
    sources, target, extra = [data_dir / "sharegpt.jsonl"], tiny_target_dir, []
    if case == "empty":
        sources = [tmp_path / "empty.jsonl"]
        sources[0].write_text("")
    elif case == "malformed":
        sources = [tmp_path / "bad.jsonl"]
        sources[0].write_text('{"conversations": [{"from": "human", "value": "hi"}]}\n{"conversations": [oops\n')
    elif case == "unusable":
        sources = [write_jsonl(tmp_path / "odd.jsonl", [{"foo": 1}, {"foo": 2}])]
    elif case == "no_data":
        sources = []
    elif case == "no_template":
        target = no_template_target
    elif case in ("stage_not_continuing", "stage_same_work_dir"):
        # a later stage that starts from another draft than stage 1's, or that would share its work_dir
        init = str(foreign_draft) if case == "stage_not_continuing" else str(tmp_path / "work" / "draft")
        later = recipe_for(
            tmp_path / ("later" if case == "stage_not_continuing" else ""), target, sources, draft={"init_from": init}
        )
        extra = ["--stages", f"[{write_recipe(tmp_path / 'later.yaml', later)}]"]
    else:
        extra = {
            "vocab_too_large": ["--draft.draft_vocab_size", "100000"],
            "aux_out_of_range": ["--draft.aux_layer_ids", "[0, 1, 7]"],
            "lora_without_draft": ["--lora.enabled", "true"],
            "foreign_draft": ["--draft.init_from", str(foreign_draft)],
            "unknown_key": ["--train.learning_rate", "0.1"],
            "zero_steps": ["--train.ttt_steps", "0"],
            "openers_not_a_list": ["--data.synthesize_openers", "Write"],
            "eval_not_a_bool": ["--data.sources", f"[{{path: {data_dir / 'sharegpt.jsonl'}, eval: no}}]"],
            "reselect_without_draft": ["--draft.reselect_vocab", "true"],
            "reselect_not_a_bool": ["--draft.reselect_vocab", "maybe"],
            "reuse_not_a_list": ["--features.mode", "offline", "--features.reuse_from", "runs/stage1"],
            "reuse_online": ["--features.reuse_from", "[runs/stage1]"],
            "stage_missing": ["--stages", "[nowhere.yaml]"],
        }[case]
    recipe = recipe_for(tmp_path, target, sources)
    config = write_recipe(tmp_path / "recipe.yaml", recipe)
    assert run_cli(config, *extra) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("eagle3-hub train: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(message, lines[0]), lines[0]
    assert not Path(recipe["work_dir"]).exists()  # nothing written: no data, no vocab, no checkpoints, no draft


def test_a_failed_push_keeps_the_draft_and_says_how_to_retry(tmp_path, tiny_target_dir, data_dir, monkeypatch, capsys):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    recipe = recipe_for(
        tmp_path, tiny_target_dir, [data_dir / "sharegpt.jsonl"], train={"max_steps": 1}, push_to_hub="alice/tiny-eagle3"
    )
    assert run_cli(write_recipe(tmp_path / "recipe.yaml", recipe)) == 1
    err = capsys.readouterr().err
    assert "No Hugging Face token found" in err and "Traceback" not in err
    assert f"eagle3-hub push {recipe['output_dir']} alice/tiny-eagle3" in err
    assert (Path(recipe["output_dir"]) / "model.safetensors").exists()


def test_overrides_are_parsed_as_yaml_and_checked_against_the_recipe():
    assert parse_overrides(["--train.lr", "3e-4", "--data.regenerate=false", "--lora.enabled", "--train.max_steps", "null"]) == {
        "train": {"lr": 3e-4, "max_steps": None},
        "data": {"regenerate": False},
        "lora": {"enabled": True},
    }
    assert parse_overrides(["--train.weight_decay", "1e-2", "--train.betas", "[0.9, 0.95]"])["train"] == {
        "weight_decay": 0.01,
        "betas": [0.9, 0.95],
    }  # YAML 1.2 floats: 1e-2 is a number, not a string
    path = Path(__file__).parents[1] / "recipes" / "smollm2-135m-instruct.yaml"
    recipe = load_recipe(path, {"train": {"lr": 0.01}})
    in_file = yaml.safe_load(path.read_text())
    assert recipe["train"]["lr"] == 0.01 and recipe["train"]["ttt_steps"] == in_file["train"]["ttt_steps"]
    assert recipe["train"]["step_weight"] == 0.8 and recipe["lora"]["enabled"] is False  # defaults fill the rest
    with pytest.raises(KeyError, match="Unknown recipe key `data.sorces`"):
        load_recipe(None, {"data": {"sorces": []}})


# ----------------------------------------------------------------------------------------------- real target
@pytest.mark.slow  # train() loads the real target itself
def test_short_real_run_on_smollm2(tmp_path, smollm2):
    """SmolLM2-135M-Instruct (float32): answers regenerated by the model itself, 3 TTT steps, a held-out eval."""
    rows = [
        {"question": q, "answer": "unused: regenerated"}
        for q in (
            "What is 12 times 3?",
            "Name the capital of France.",
            "Give one word that rhymes with cat.",
            "How many legs does a spider have?",
            "What colour is the sky on a clear day?",
            "Spell the word dog backwards.",
            "What is 100 minus 42?",
            "Which is larger, 7 or 9?",
        )
    ]
    recipe = load_recipe(
        None,
        {
            "target": {"name": None, "dtype": "float32"},
            "draft": {"draft_vocab_size": 2048},
            "data": {
                "sources": [str(write_jsonl(tmp_path / "q.jsonl", rows))],
                "regenerate": True,
                "max_new_tokens": 24,
                "gen_batch_size": 8,
                "max_length": 96,
                "eval_samples": 2,
            },
            "train": {
                "ttt_steps": 3,
                "max_steps": 3,
                "batch_size": 4,
                "lr": 1e-3,
                "warmup_steps": 1,
                "save_every": 3,
                "eval_every": 3,
                "log_every": 1,
                "num_threads": 1,
            },
            "work_dir": str(tmp_path / "work"),
        },
    )
    out = train(recipe)
    metrics = json.loads((out / "training_metrics.json").read_text())
    data = dict(metrics["data"])
    generation = data.pop("generation")  # how the answers were regenerated
    assert data == {
        "samples": 8,
        "truncated": 0,
        "dropped_no_loss_tokens": 0,
        "kept": 8,
        "eval_candidates": 8,
        "train": 7,
        "eval": 1,
    }
    calls = [c for file_calls in generation["calls"].values() for c in file_calls]
    assert generation["regenerate_with"] == "auto" and sum(c["samples"] for c in calls) == 8
    # greedy answers on a CPU: plain decoding through the same forward, faster for batches than a tree
    assert generation["draft"] is None and {(c["decoder"], c["draft"]) for c in calls} == {("same_forward", None)}
    assert metrics["vocab"]["coverage"] == 1.0 and metrics["acceptance"]["step"] == 3
    assert len(metrics["acceptance"]["step_accuracy"]) == 3
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26] and config["draft_vocab_size"] == 2048
    target, tok = smollm2
    draft = Eagle3DraftModel.from_pretrained(out, target=target, dtype=torch.float32)
    ids = tok("The answer is", return_tensors="pt").input_ids
    aux, _ = aux_features(target, ids, torch.ones_like(ids), draft.config.aux_layer_ids)
    assert torch.isfinite(draft(input_ids=ids, target_hidden_states=aux).logits).all()
    draft.unbind()  # the target is shared with other tests


def test_a_later_stage_takes_the_generations_an_earlier_run_wrote(tmp_path):
    """features.reuse_from also lends its run's generation caches (named by the hash of prompts, target and
    settings): a later stage over the same data reads them instead of generating for an hour again; a cache this run
    already has is its own, and a run that is not on this machine lends nothing."""
    from eagle3_hub.training.splits import take_generations

    earlier, work = tmp_path / "stage2" / "data", tmp_path / "stage3" / "data"
    earlier.mkdir(parents=True)
    (earlier / "regen-abc.jsonl").write_text('{"index": 0}\n')
    (earlier / "synth-seed1.jsonl").write_text('{"earlier": true}\n')
    (earlier / "data_key.json").write_text("{}")
    work.mkdir(parents=True)
    (work / "synth-seed1.jsonl").write_text('{"own": true}\n')
    taken = take_generations([tmp_path / "stage2", tmp_path / "gone"], work)
    assert taken == ["regen-abc.jsonl"]
    assert (work / "regen-abc.jsonl").read_text() == '{"index": 0}\n'
    assert (work / "synth-seed1.jsonl").read_text() == '{"own": true}\n' and not (work / "data_key.json").exists()
