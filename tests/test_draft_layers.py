"""Drafts with sliding-window layers (``layer_types``, ``sliding_window``) and with several decoder layers
(``num_hidden_layers``): the model, tree decoding, assisted generation, training and the layouts; and the config
fields of every layout, each modelled, inert, refused by name or warned about."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from engine_spec import vllm_problems
from safetensors.torch import load_file, save_file
from tiny_models import left_padded, make_tiny_target
from transformers import DynamicCache

from eagle3_hub import Eagle3Config, Eagle3DraftModel
from eagle3_hub.formats import export_draft
from eagle3_hub.formats.fields import INERT, MODELLED, UNMODELLED
from eagle3_hub.generation.tree import generate
from eagle3_hub.generation.tree.drafting import Drafter
from eagle3_hub.training.ttt import causal_mask, step_masks, ttt_loss

WINDOWED = dict(layer_types=["sliding_attention"], sliding_window=5)
TWO_LAYERS = dict(num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"], sliding_window=4)
TWO_FULL = dict(num_hidden_layers=2)
VARIANTS = {"windowed": WINDOWED, "two-layers-one-sliding": TWO_LAYERS, "two-full-layers": TWO_FULL}


def random_draft(target, seed=1, **kwargs) -> Eagle3DraftModel:
    """A draft whose every weight matters (std 0.3): attention, both layers and the window change its predictions."""
    torch.manual_seed(seed)
    draft = Eagle3DraftModel.from_target(target, **kwargs).eval()
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.ndim == 2 and name != "embed_tokens.weight":
                p.normal_(std=0.3)
    return draft


def ids_and_features(target, n=24, seed=2):
    ids = torch.randint(3, target.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
    aux = [1, 2, 3]
    return ids, torch.cat([hidden[i + 1] for i in aux], dim=-1)


def plain_greedy(target, ids, mask, n):
    return target.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)


# --------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kwargs, fix",
    [
        (dict(num_hidden_layers=0), "num_hidden_layers"),
        (dict(num_hidden_layers=2, layer_types=["full_attention"]), "layer_types"),
        (dict(layer_types=["chunked_attention"]), "layer_types"),
        (dict(layer_types=["sliding_attention"]), "sliding_window"),
        (dict(layer_types=["sliding_attention"], sliding_window=0), "sliding_window"),
    ],
)
def test_config_refuses_inconsistent_layers(kwargs, fix):
    with pytest.raises(ValueError, match=fix):
        Eagle3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_attention_heads=2, **kwargs)


def test_all_full_single_layer_config_json_is_unchanged():
    """An all-full draft writes no layer_types / sliding_window: the reference's config.json, as engines read it."""
    config = Eagle3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_attention_heads=2)
    assert {"layer_types", "sliding_window"}.isdisjoint(json.loads(config.to_json_string()))
    windowed = Eagle3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_attention_heads=2, **WINDOWED)
    saved = json.loads(windowed.to_json_string())
    assert (saved["layer_types"], saved["sliding_window"]) == (["sliding_attention"], 5)


# --------------------------------------------------------------------------------------------------- model
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_incremental_forward_equals_full_forward(variant):
    """The draft over a cache, in two chunks, gives the logits of one forward over all positions, and a window
    shorter than the context changes them (it is applied)."""
    target = make_tiny_target("llama")
    draft = random_draft(target, **VARIANTS[variant])
    ids, feats = ids_and_features(target)
    full = draft(input_ids=ids[:, 1:], target_hidden_states=feats[:, :-1]).logits
    first = draft(input_ids=ids[:, 1:12], target_hidden_states=feats[:, :11], use_cache=True)
    second = draft(input_ids=ids[:, 12:], target_hidden_states=feats[:, 11:-1], cache=first.cache, use_cache=True)
    torch.testing.assert_close(torch.cat([first.logits, second.logits], dim=1), full, atol=1e-4, rtol=1e-4)
    if "sliding_attention" in draft.config.layer_types:
        unwindowed = Eagle3DraftModel(Eagle3Config(**{**draft.config.to_dict(), "layer_types": None, "sliding_window": None}))
        unwindowed.load_state_dict(draft.state_dict())
        assert not torch.allclose(unwindowed.eval()(input_ids=ids[:, 1:], target_hidden_states=feats[:, :-1]).logits, full)


def test_a_single_explicit_mask_is_refused_for_a_windowed_draft():
    target = make_tiny_target("llama")
    draft = random_draft(target, **WINDOWED)
    ids, feats = ids_and_features(target, n=6)
    mask = torch.zeros(1, 1, 5, 5)
    with pytest.raises(ValueError, match="sliding_attention"):
        draft(input_ids=ids[:, 1:], target_hidden_states=feats[:, :-1], attention_mask=mask)


def test_later_layers_are_named_as_vllm_and_speculators_name_them():
    target = make_tiny_target("llama")
    names = set(random_draft(target, num_hidden_layers=3).state_dict())
    assert {
        "layers.1.self_attn.q_proj.weight",
        "layers.2.mlp.down_proj.weight",
        "layers.1.input_layernorm.weight",
        "midlayer.hidden_norm.weight",
    } <= names
    assert not any(n.startswith("layers.0.") or n.startswith("layers.1.hidden_norm") for n in names)


# --------------------------------------------------------------------------------------------------- tree decoding
@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])
@pytest.mark.parametrize("variant", ["windowed", "two-layers-one-sliding"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "fixed-shapes"])
def test_tree_chain_equals_the_drafts_full_forward(arch, variant, graph, monkeypatch):
    """With one child per node the tree is the draft's greedy chain: at every step its tokens equal the chain of
    the draft run without tree decoding (one forward over the whole context, then one step per token), with a
    window shorter than the context. The output is plain greedy."""
    target = make_tiny_target(arch)
    draft = random_draft(target, **VARIANTS[variant])
    chains = []
    draft_tree = Drafter.draft_tree

    def recording(self, depth, next_pos, *args, **kwargs):
        out = draft_tree(self, depth, next_pos, *args, **kwargs)
        chains.append((int(next_pos[0]), out[0][0].tolist()))
        return out

    monkeypatch.setattr(Drafter, "draft_tree", recording)
    ids = torch.randint(3, 256, (1, 10), generator=torch.Generator().manual_seed(3))
    depth = 4
    out = generate(
        target,
        draft,
        ids,
        max_new_tokens=40,
        eos_token_id=[],
        depth=depth,
        tree_top_k=1,
        total_tokens=depth,
        min_node_prob=0.0,
        grow_min_prob=0.0,
        lookup_tokens=0,
        draft_graph=graph,
    )
    seq = out.sequences
    assert torch.equal(seq, plain_greedy(target, ids, torch.ones_like(ids), 40))
    with torch.no_grad():
        hidden = target(seq, output_hidden_states=True).hidden_states
    feats = torch.cat([hidden[i + 1] for i in draft.config.aux_layer_ids], dim=-1)
    assert len(chains) > 3 and max(p for p, _ in chains) > 2 * draft.config.sliding_window
    with torch.no_grad():
        for next_pos, tree_chain in chains:
            step = draft(
                input_ids=seq[:, 1 : next_pos + 1], target_hidden_states=feats[:, :next_pos], cache=DynamicCache(), use_cache=True
            )
            chain = []
            for d in range(len(tree_chain)):
                token = draft.draft_to_target_ids(step.logits[:, -1].argmax(-1, keepdim=True))
                chain.append(int(token))
                step = draft(
                    input_ids=token,
                    hidden_states=step.hidden_states[:, -1:],
                    cache=step.cache,
                    position_ids=torch.tensor([[next_pos + d]]),
                    use_cache=True,
                )
            assert chain == tree_chain, f"root at position {next_pos}"


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2"])
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_tree_decoding_is_lossless_with_a_window_shorter_than_the_context(arch, variant):
    """A left-padded batch (holes in the caches) and full trees; float32 tokens equal plain greedy per row."""
    target = make_tiny_target(arch)
    draft = random_draft(target, **VARIANTS[variant])
    prompts = [torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(n)) for n in (5, 12)]
    ids, mask = left_padded(prompts)
    for graph in (False, True):
        out = generate(
            target,
            draft,
            ids,
            attention_mask=mask,
            max_new_tokens=30,
            eos_token_id=[],
            depth=4,
            tree_top_k=3,
            total_tokens=10,
            min_node_prob=0.0,
            draft_graph=graph,
        )
        for i, p in enumerate(prompts):
            ref = plain_greedy(target, p[None], torch.ones(1, len(p), dtype=torch.long), 30)[0, len(p) :]
            assert torch.equal(out.sequences[i, ids.shape[1] :], ref), f"row {i}, draft_graph={graph}"


# --------------------------------------------------------------------------------------------------- assisted
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_assisted_generation_is_lossless(arch, variant):
    target = make_tiny_target(arch)
    draft = random_draft(target, **VARIANTS[variant]).bind(target)
    draft.generation_config.num_assistant_tokens = 4
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    ids = torch.randint(3, 256, (1, 9), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    out = target.generate(
        ids, attention_mask=mask, assistant_model=draft, do_sample=False, max_new_tokens=40, pad_token_id=0, eos_token_id=None
    )
    assert torch.equal(out, plain_greedy(target, ids, mask, 40))


# --------------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("variant", ["windowed", "two-layers-one-sliding"])
def test_ttt_steps_see_what_inference_sees(variant):
    """TTT step k at row t (position t + k, the window counted from there) gives the logits of the draft at
    inference: the context read with a cache, then k steps on its own hidden state."""
    target = make_tiny_target("llama")
    draft = random_draft(target, **VARIANTS[variant])
    ids, feats = ids_and_features(target, n=20)
    s = 16
    ttt_cache, hidden, steps = [], None, []
    with torch.no_grad():
        for k in range(3):
            kwargs = dict(
                input_ids=ids[:, 1 + k : 1 + k + s],
                position_ids=torch.arange(s)[None] + k,
                attention_mask=step_masks(draft.config, causal_mask(s, torch.float32, "cpu"), torch.arange(s)[None], k),
                ttt_cache=ttt_cache,
            )
            out = draft(target_hidden_states=feats[:, :s], **kwargs) if k == 0 else draft(hidden_states=hidden, **kwargs)
            hidden = out.hidden_states
            steps.append(out.logits)
        for t in (draft.config.sliding_window + 3, s - 1):
            step = draft(
                input_ids=ids[:, 1 : t + 2], target_hidden_states=feats[:, : t + 1], cache=DynamicCache(), use_cache=True
            )
            torch.testing.assert_close(step.logits[:, -1], steps[0][:, t], atol=1e-4, rtol=1e-4)
            for k in (1, 2):
                step = draft(
                    input_ids=ids[:, t + 1 + k : t + 2 + k],
                    hidden_states=step.hidden_states[:, -1:],
                    cache=step.cache,
                    position_ids=torch.tensor([[t + k]]),
                    use_cache=True,
                )
                torch.testing.assert_close(step.logits[:, -1], steps[k][:, t], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", ["windowed", "two-layers-one-sliding"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_training_steps_lower_the_loss(variant, checkpointing):
    target = make_tiny_target("llama")
    draft = Eagle3DraftModel.from_target(target, **VARIANTS[variant])
    if checkpointing:
        draft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids, feats = ids_and_features(target, n=24)
    with torch.no_grad():
        logits = target(ids).logits
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-2)
    draft.train()
    losses = []
    for _ in range(8):
        out = ttt_loss(draft, feats, ids, logits, torch.ones_like(ids), ttt_steps=3)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss.detach()))
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    later = [p.grad for n, p in draft.named_parameters() if n.startswith("layers.1.")]
    assert all(g is not None and bool(g.abs().sum() > 0) for g in later) or draft.config.num_hidden_layers == 1


# --------------------------------------------------------------------------------------------------- formats
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_round_trips_keep_the_fields_and_the_tensors(tmp_path, variant):
    """ours -> ours, ours -> vllm (speculators layout) -> ours: the layer fields kept, every tensor bit-exact."""
    target = make_tiny_target("llama")
    draft = random_draft(target, **VARIANTS[variant])
    state = draft.state_dict()
    export_draft(draft, tmp_path / "ours")
    export_draft(draft, tmp_path / "vllm", to="vllm", verifier="tiny")
    assert vllm_problems(tmp_path / "vllm", num_target_layers=4) == []
    layer = json.loads((tmp_path / "vllm" / "config.json").read_text())["transformer_layer_config"]
    assert layer["num_hidden_layers"] == draft.config.num_hidden_layers
    if "sliding_attention" in draft.config.layer_types:
        assert (layer["layer_types"], layer["sliding_window"]) == (draft.config.layer_types, draft.config.sliding_window)
    names = set(load_file(tmp_path / "vllm" / "model.safetensors"))
    assert {n for n in names if n.startswith("layers.")} == {
        ("layers.0." + n[len("midlayer.") :]) if n.startswith("midlayer.") else n
        for n in state
        if n.startswith(("midlayer.", "layers."))
    }
    for folder in ("ours", "vllm"):
        loaded = Eagle3DraftModel.from_pretrained(tmp_path / folder, target=target)
        c = loaded.config
        assert (c.num_hidden_layers, c.layer_types, c.sliding_window) == (
            draft.config.num_hidden_layers,
            draft.config.layer_types,
            draft.config.sliding_window,
        )
        for name, tensor in state.items():
            if name != "embed_tokens.weight":
                assert torch.equal(loaded.state_dict()[name], tensor), f"{folder}: {name}"


@pytest.mark.parametrize("variant", ["windowed", "two-full-layers"])
def test_sglang_export_refuses_what_sglang_would_serve_differently(tmp_path, variant):
    target = make_tiny_target("llama")
    draft = random_draft(target, aux_layer_ids=[0, 1, 2], **VARIANTS[variant])  # layers SGLang can capture
    with pytest.raises(ValueError, match="SGLang 0.5") as e:
        export_draft(draft, tmp_path / "sglang", to="sglang")
    assert "--to vllm" in str(e.value) and not (tmp_path / "sglang").exists()


def _speculators_09_folder(folder, target, **layer):
    """A speculators folder with the keys its 0.9 trainer writes by default (norms on, a window on every layer)."""
    draft = random_draft(target, norm_before_fc=True, norm_before_residual=True, norm_output=True, **WINDOWED)
    export_draft(draft, folder, to="vllm", verifier="tiny")
    config = json.loads((folder / "config.json").read_text())
    config["transformer_layer_config"].update(layer)
    (folder / "config.json").write_text(json.dumps(config))
    return draft


def test_a_speculators_windowed_draft_loads_as_the_same_model(tmp_path):
    target = make_tiny_target("llama")
    draft = _speculators_09_folder(tmp_path / "d", target)
    loaded = Eagle3DraftModel.from_pretrained(tmp_path / "d", target=target)
    c = loaded.config
    assert (c.layer_types, c.sliding_window, c.norm_before_fc, c.norm_before_residual, c.norm_output) == (
        ["sliding_attention"],
        5,
        True,
        True,
        True,
    )
    ids, feats = ids_and_features(target)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=ids[:, 1:], target_hidden_states=feats[:, :-1]).logits,
            draft(input_ids=ids[:, 1:], target_hidden_states=feats[:, :-1]).logits,
        )


# every field a draft config can carry: known ones must be modelled, inert or refused; an unknown one is named
def test_every_known_field_is_accounted_for_and_an_unknown_one_is_named(tmp_path, caplog):
    target = make_tiny_target("llama")
    draft = random_draft(target, aux_layer_ids=[0, 1, 2])
    export_draft(draft, tmp_path / "base", to="sglang")
    base = json.loads((tmp_path / "base" / "config.json").read_text())
    tensors = load_file(tmp_path / "base" / "model.safetensors")

    def load(extra: dict):
        folder = tmp_path / f"f{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps({**base, **extra}))
        return Eagle3DraftModel.from_pretrained(folder)

    assert not MODELLED & INERT and not set(UNMODELLED) & (MODELLED | INERT)
    for key, default in UNMODELLED.items():  # at its neutral value: loads; else refused by name
        load({key: default})
        changed = {None: 2.0, False: True, 1.0: 2.0}[default]
        with pytest.raises(ValueError, match=rf"{key}={changed!r}"):
            load({key: changed})
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        load(
            {key: None for key in INERT - MODELLED if key not in base and not key.startswith("speculators")}
            | {"use_sliding_window": False}
        )
    assert not [r for r in caplog.records if "does not know" in r.getMessage()]
    with caplog.at_level(logging.WARNING):
        load({"attention_temperature_tuning": 0.5})
    assert any("attention_temperature_tuning" in r.getMessage() for r in caplog.records)
    with caplog.at_level(logging.WARNING):
        loaded = load({"sliding_window": 8})  # a window without layer_types: full attention, as vLLM reads it
    assert loaded.config.layer_types == ["full_attention"] and any("layer_types" in r.getMessage() for r in caplog.records)
    loaded = load({"num_hidden_layers": 1, "layer_types": ["sliding_attention"], "sliding_window": 3})
    assert (loaded.config.layer_types, loaded.config.sliding_window) == (["sliding_attention"], 3)


def test_the_model_card_describes_the_layers(tmp_path):
    from eagle3_hub.card import write_model_card

    target = make_tiny_target("llama")
    Eagle3DraftModel.from_target(target, **TWO_LAYERS).save_pretrained(tmp_path / "d")
    text = write_model_card(tmp_path / "d", base_model="HuggingFaceTB/SmolLM2-135M-Instruct").read_text()
    assert "then 1 further Llama decoder layer; sliding-window attention (4 positions) in layers 1" in text


def test_a_recipe_trains_a_windowed_two_layer_draft(tmp_path, tiny_target_dir, data_dir):
    """`eagle3-hub train` with `draft: {num_hidden_layers: 2, layer_types: [...], sliding_window: 4}`: the saved
    draft keeps the fields, and tree decoding with it is lossless."""
    from training_helpers import recipe_for

    from eagle3_hub.targets import load_target
    from eagle3_hub.training.train import train

    recipe = recipe_for(
        tmp_path,
        tiny_target_dir,
        [data_dir / "prompts.json"],
        draft=TWO_LAYERS,
        train={"max_steps": 2, "save_every": 2, "eval_every": 2},
    )
    train(recipe)
    target, _ = load_target(str(tiny_target_dir), dtype=torch.float32)
    draft = Eagle3DraftModel.from_pretrained(tmp_path / "work" / "draft", target=target)
    c = draft.config
    assert (c.num_hidden_layers, c.layer_types, c.sliding_window) == (2, TWO_LAYERS["layer_types"], 4)
    ids = torch.randint(3, target.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    out = generate(target, draft, ids, max_new_tokens=20, eos_token_id=[], depth=3, tree_top_k=2, total_tokens=6)
    assert torch.equal(out.sequences, plain_greedy(target, ids, torch.ones_like(ids), 20))


def test_inconsistent_layer_fields_of_a_foreign_config_name_the_folder(tmp_path):
    target = make_tiny_target("llama")
    folder = tmp_path / "spec"
    _speculators_09_folder(folder, target, num_hidden_layers=2)  # layer_types still lists one layer
    with pytest.raises(ValueError, match=r"spec's config.json: layer_types=\['sliding_attention'\] must list"):
        Eagle3DraftModel.from_pretrained(folder)
