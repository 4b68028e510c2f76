"""The EAGLE-3 draft as a transformers assistant: ``target.generate(ids, assistant_model=draft)``.

Lossless checks compare tokens in float32 against plain ``target.generate``. Tests of the acceptance
mechanics use a tiny draft trained (a few seconds, below) on its tiny target's own greedy continuations, so
that it really accepts several tokens per round on those prompts.
"""

from __future__ import annotations

import copy
import gc
import threading
import weakref

import pytest
import torch
import torch.nn.functional as F
import transformers
from packaging.version import Version
from tiny_models import ARCHITECTURES, make_tiny_target
from transformers import AutoModel, GenerationConfig, StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from eagle3_hub import Eagle3DraftModel

VOCAB = 256


def make_pair(arch: str = "llama", seed: int = 0, **draft_kwargs):
    target = make_tiny_target(arch, seed=seed)
    torch.manual_seed(seed + 1)
    draft = Eagle3DraftModel.from_target(target, **draft_kwargs).eval()
    draft.bind(target)
    return target, draft


def configure(draft, num_tokens: int = 4, schedule: str = "constant", threshold: float | None = 0.0):
    draft.generation_config.num_assistant_tokens = num_tokens
    draft.generation_config.num_assistant_tokens_schedule = schedule
    draft.generation_config.assistant_confidence_threshold = threshold


def random_prompts(n: int, length: int = 8, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n, length), generator=g)


def train_draft_on_target_outputs(target, draft, prompts, new_tokens=40, steps=100, ttt_steps=3, seed=0):
    """Fit ``draft`` to the target's greedy continuations of ``prompts`` (EAGLE-3 training-time test: step 0
    reads target features, steps 1..ttt_steps-1 the draft's own hidden states)."""
    seqs = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens, do_sample=False)
    with torch.no_grad():
        hidden = target(seqs, output_hidden_states=True).hidden_states
    feats = torch.cat([hidden[i + 1] for i in draft.config.aux_layer_ids], dim=-1)  # (N, S, 3*Ht)
    n = seqs.shape[1] - 1 - ttt_steps  # rows t: feature t, token t+1+j at step j, label t+2+j
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    draft.train()
    for _ in range(steps):
        idx = torch.randint(0, seqs.shape[0], (16,), generator=g)
        s, f = seqs[idx], feats[idx]
        ttt_cache, loss, h = [], 0.0, None
        for j in range(ttt_steps):
            pos = (torch.arange(n) + j).expand(len(idx), -1)
            inputs = dict(input_ids=s[:, 1 + j : 1 + j + n], position_ids=pos, attention_mask=mask, ttt_cache=ttt_cache)
            out = draft(target_hidden_states=f[:, :n], **inputs) if j == 0 else draft(hidden_states=h, **inputs)
            h = out.hidden_states
            labels = s[:, 2 + j : 2 + j + n]
            loss = loss + F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), labels.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    draft.eval()
    return seqs


@pytest.fixture(scope="module")
def trained():
    """(target, draft, prompts): a tiny Llama and a draft that predicts its greedy continuations of ``prompts``."""
    target, draft = make_pair("llama")
    prompts = random_prompts(32, seed=1)
    train_draft_on_target_outputs(target, draft, prompts)
    return target, draft, prompts


def plain(target, ids, **kwargs):
    return target.generate(ids, do_sample=False, **kwargs)


def assisted(target, draft, ids, **kwargs):
    return target.generate(ids, assistant_model=draft, do_sample=False, **kwargs)


def check_stats(stats, new_tokens: int):
    """new tokens = target forwards (one bonus token each) + accepted candidates."""
    seen = stats["target_forwards"] + stats["accepted_tokens"]
    assert seen <= new_tokens <= seen + stats["pending_drafted_tokens"], stats
    assert stats["extra_target_forwards"] == 0


class RecordLengths(StoppingCriteria):
    """Records the sequence length after every target round (transformers calls it once per round)."""

    def __init__(self):
        self.lengths = []

    def __call__(self, input_ids, scores, **kwargs):
        self.lengths.append(input_ids.shape[1])
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


# ---------------------------------------------------------------------------------------------- hooks


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_hooks_capture_the_hf_hidden_states(arch):
    """A captured feature of aux layer i is HF's ``output_hidden_states[i + 1]`` (post-norm for the last layer)."""
    target, draft = make_pair(arch)
    assert draft.config.aux_layer_ids[-1] == target.config.num_hidden_layers - 1  # exercises the final-norm case
    ids = random_prompts(1, length=10)
    draft._capture.arm(end=9)
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    expected = torch.cat([out.hidden_states[i + 1] for i in draft.config.aux_layer_ids], dim=-1)
    captured = draft._capture.take(0, 9, "cpu")
    torch.testing.assert_close(captured, expected, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_lossless_every_architecture(arch):
    target, draft = make_pair(arch)
    prompt = random_prompts(1, length=11, seed=3)
    for ids in (prompt[:, :6], prompt):
        ref = plain(target, ids, max_new_tokens=24)
        configure(draft, num_tokens=4, threshold=0.0)  # 4 candidates a round, mostly rejected
        out = assisted(target, draft, ids, max_new_tokens=24)
        assert torch.equal(out, ref)
        check_stats(draft.last_assisted_stats, ref.shape[1] - ids.shape[1])
        configure(draft, num_tokens=20, threshold=None)  # transformers' defaults (confidence threshold 0.4)
        out = assisted(target, draft, ids, max_new_tokens=24)
        assert torch.equal(out, ref)


@pytest.mark.parametrize("arch", ["mistral", "gemma3_text"])
def test_greedy_lossless_past_the_sliding_window(arch):
    target = make_tiny_target(arch, sliding_window=16)
    draft = Eagle3DraftModel.from_target(target).eval().bind(target)
    configure(draft, num_tokens=4, threshold=0.0)
    ids = random_prompts(1)
    assert torch.equal(assisted(target, draft, ids, max_new_tokens=40), plain(target, ids, max_new_tokens=40))


def test_greedy_lossless_trained_draft_accepts_blocks(trained):
    target, draft, prompts = trained
    configure(draft, num_tokens=5, threshold=0.0)
    accepted, rounds = 0, 0
    for ids in prompts[:6]:
        ids = ids[None]
        ref = plain(target, ids, max_new_tokens=40)
        out = assisted(target, draft, ids, max_new_tokens=40)
        assert torch.equal(out, ref)
        stats = draft.last_assisted_stats
        check_stats(stats, out.shape[1] - ids.shape[1])
        accepted += stats["accepted_tokens"]
        rounds += sum(r["accepted"] is not None for r in stats["rounds"])
        assert stats["target_forwards"] < 40
    assert accepted / rounds > 2.0  # the draft predicts several target tokens per round


def test_max_new_tokens_mid_block(trained):
    target, draft, prompts = trained
    configure(draft, num_tokens=6, threshold=0.0)
    ids = prompts[:1]
    for max_new in range(1, 10):
        ref = plain(target, ids, max_new_tokens=max_new)
        out = assisted(target, draft, ids, max_new_tokens=max_new)
        assert torch.equal(out, ref), max_new
        assert out.shape[1] == ids.shape[1] + max_new
        if max_new == 1:
            continue  # transformers does not ask the assistant for a single token
        assert draft.last_assisted_stats["target_forwards"] + draft.last_assisted_stats["accepted_tokens"] <= max_new
        # never drafted past max_length - 1 (transformers' cap), so the last block ends at the limit
        for r in draft.last_assisted_stats["rounds"]:
            assert r["input_length"] + r["drafted"] <= ids.shape[1] + max_new - 1


def test_eos_inside_a_drafted_block(trained):
    """EOS at a candidate position of the final block (drafted and accepted, or the target's token after a
    rejection): the output stops there exactly as plain generation does."""
    target, draft, prompts = trained
    configure(draft, num_tokens=5, threshold=0.0)
    inside = 0
    for ids in prompts[:8]:
        ids = ids[None]
        full = plain(target, ids, max_new_tokens=30)[0, ids.shape[1] :].tolist()
        for j in (3, 7, 11):
            eos = full[j]
            if eos in full[:j]:
                continue
            ref = plain(target, ids, max_new_tokens=30, eos_token_id=eos, pad_token_id=0)
            out = assisted(target, draft, ids, max_new_tokens=30, eos_token_id=eos, pad_token_id=0)
            assert torch.equal(out, ref)
            assert out[0, -1].item() == eos and out.shape[1] == ids.shape[1] + j + 1
            last = draft.last_assisted_stats["rounds"][-1]
            e = out.shape[1] - 1
            if last["drafted"] >= 2 and last["input_length"] <= e < last["input_length"] + last["drafted"]:
                inside += 1
    assert inside >= 2


def test_static_cache_and_scores(trained):
    target, draft, prompts = trained
    configure(draft, num_tokens=5, threshold=0.0)
    ids = prompts[2:3]
    kwargs = dict(max_new_tokens=20, return_dict_in_generate=True, output_scores=True)
    ref = plain(target, ids, **kwargs)
    out = assisted(target, draft, ids, **kwargs)
    assert torch.equal(out.sequences, ref.sequences)
    assert len(out.scores) == len(ref.scores) == 20
    for a, b in zip(out.scores, ref.scores):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    if Version(transformers.__version__) < Version("5.24"):  # transformers refuses it before: its own limit
        with pytest.raises(ValueError, match="not supported with Static cache"):
            assisted(target, draft, ids, max_new_tokens=20, cache_implementation="static")
        return
    ref = plain(target, ids, max_new_tokens=20, cache_implementation="static")
    out = assisted(target, draft, ids, max_new_tokens=20, cache_implementation="static")
    assert torch.equal(out, ref)
    assert draft.last_assisted_stats["accepted_tokens"] > 0


class DropCapturedFeatures(StoppingCriteria):
    """Throws away the target features the hooks captured in one round (as if a forward had been missed)."""

    def __init__(self, draft, at_round: int):
        self.draft, self.at_round, self.calls = draft, at_round, 0

    def __call__(self, input_ids, scores, **kwargs):
        self.calls += 1
        if self.calls == self.at_round:
            self.draft._capture.rows = []
        return torch.zeros(1, dtype=torch.bool)


def test_missing_features_are_recomputed(trained):
    """If captured features are missing, the draft runs the target once itself and stays correct."""
    target, draft, prompts = trained
    configure(draft, num_tokens=5, threshold=0.0)
    ids = prompts[3:4]
    ref = plain(target, ids, max_new_tokens=30)
    drop = DropCapturedFeatures(draft, at_round=3)
    out = target.generate(
        ids, assistant_model=draft, do_sample=False, max_new_tokens=30, stopping_criteria=StoppingCriteriaList([drop])
    )
    assert torch.equal(out, ref)
    stats = draft.last_assisted_stats
    assert stats["extra_target_forwards"] == 1
    assert stats["accepted_tokens"] > 10  # the recomputed features are the right ones


# ---------------------------------------------------------------------------------------------- draft KV cache


class SnapshotDraftCache(StoppingCriteria):
    """After every target round: the draft's cache entries that it claims were built from target features."""

    def __init__(self, draft):
        self.draft, self.snapshots = draft, []

    def __call__(self, input_ids, scores, **kwargs):
        session = self.draft._assist_session
        cache = session.cache_ref() if session.cache_ref is not None else None
        if cache is not None and session.valid_length > 0:
            layer = cache.layers[0]
            v = session.valid_length
            self.snapshots.append((v, layer.keys[:, :, :v].clone(), layer.values[:, :, :v].clone()))
        return torch.zeros(1, dtype=torch.bool)


def test_draft_cache_matches_recomputation_from_scratch(trained):
    target, draft, prompts = trained
    configure(draft, num_tokens=5, threshold=0.0)
    ids = prompts[4:5]
    snap = SnapshotDraftCache(draft)
    out = target.generate(
        ids, assistant_model=draft, do_sample=False, max_new_tokens=30, stopping_criteria=StoppingCriteriaList([snap])
    )
    stats = draft.last_assisted_stats
    assert stats["accepted_tokens"] > 5  # accepted candidates were first cached from the draft's own states
    # from scratch: target features of the final sequence, one draft forward over the whole prefix
    with torch.no_grad():
        hidden = target(out, output_hidden_states=True).hidden_states
        feats = torch.cat([hidden[i + 1] for i in draft.config.aux_layer_ids], dim=-1)
        n = out.shape[1] - 1
        ref = draft(input_ids=out[:, 1 : n + 1], target_hidden_states=feats[:, :n], use_cache=True).cache.layers[0]
    assert len(snap.snapshots) >= 5
    for v, keys, values in snap.snapshots:
        torch.testing.assert_close(keys, ref.keys[:, :, :v], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(values, ref.values[:, :, :v], rtol=1e-4, atol=1e-4)
    # the same check fails for entries computed from the draft's own hidden states: the test can tell them apart
    with torch.no_grad():
        h = draft(input_ids=out[:, 1:2], target_hidden_states=feats[:, :1]).hidden_states
        own = draft(input_ids=out[:, 2:3], hidden_states=h, position_ids=torch.tensor([[1]]), use_cache=True)
    assert not torch.allclose(own.cache.layers[0].keys[:, :, 0], ref.keys[:, :, 1], atol=1e-3)


# ---------------------------------------------------------------------------------------------- schedules


def test_num_assistant_tokens_constant(trained):
    target, draft, prompts = trained
    configure(draft, num_tokens=3, schedule="constant", threshold=0.0)
    ids = prompts[5:6]
    out = assisted(target, draft, ids, max_new_tokens=30)
    max_length = ids.shape[1] + 30
    for r in draft.last_assisted_stats["rounds"]:
        assert r["drafted"] == min(3, max_length - r["input_length"] - 1)
    assert draft.generation_config.num_assistant_tokens == 3
    assert torch.equal(out, plain(target, ids, max_new_tokens=30))


@pytest.mark.parametrize("schedule", ["heuristic", "heuristic_transient"])
def test_num_assistant_tokens_heuristics(trained, schedule):
    """+2 after a fully accepted round, -1 (at least 1) otherwise; ``heuristic`` keeps the final value on the
    draft's generation_config, ``heuristic_transient`` does not."""
    target, draft, prompts = trained
    configure(draft, num_tokens=2, schedule=schedule, threshold=0.0)
    ids = prompts[6:7]
    recorder = RecordLengths()
    criteria = StoppingCriteriaList([recorder])
    out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=40, stopping_criteria=criteria)
    assert torch.equal(out, plain(target, ids, max_new_tokens=40))
    max_length = ids.shape[1] + 40
    rounds = draft.last_assisted_stats["rounds"]
    # transformers' rounds: the placeholder (1 candidate), the drafting rounds, maybe a last one without drafting
    starts = [ids.shape[1]] + recorder.lengths[:-1]
    candidates = [1] + [r["drafted"] for r in rounds] + [0] * (len(starts) - len(rounds) - 1)
    n, grew = 2, False
    for i, (start, end, k) in enumerate(zip(starts, recorder.lengths, candidates)):
        if 1 <= i <= len(rounds):
            assert rounds[i - 1]["input_length"] == start
            assert k == min(n, max_length - start - 1)
            grew |= k > 2
        n = n + 2 if end - start - 1 == k else max(1, n - 1)
    assert grew
    expected = n if schedule == "heuristic" else 2
    assert draft.generation_config.num_assistant_tokens == expected


def test_assistant_confidence_threshold(trained):
    target, draft, prompts = trained
    ids = prompts[7:8]
    ref = plain(target, ids, max_new_tokens=30)
    configure(draft, num_tokens=6, threshold=1.0)  # no token is certain: one candidate per round
    assert torch.equal(assisted(target, draft, ids, max_new_tokens=30), ref)
    assert {r["drafted"] for r in draft.last_assisted_stats["rounds"]} == {1}
    configure(draft, num_tokens=6, threshold=0.5)  # stops after the first unsure candidate
    assert torch.equal(assisted(target, draft, ids, max_new_tokens=30), ref)
    drafted = [r["drafted"] for r in draft.last_assisted_stats["rounds"][:-1]]
    assert 1 in drafted and max(drafted) > 1


# ---------------------------------------------------------------------------------------------- sampling


def exact_marginals(target, ids, steps: int, temperature: float, top_k: int, top_p: float) -> list[torch.Tensor]:
    """Exact distribution of each of the next ``steps`` tokens under the target's processed sampling
    distribution (top-k keeps the support small, so every prefix is enumerated)."""
    warpers = [TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k), TopPLogitsWarper(top_p)]
    prefixes, weights, marginals = ids, torch.ones(1, dtype=torch.float64), []
    for _ in range(steps):
        with torch.no_grad():
            logits = target(prefixes).logits[:, -1].float()
        for w in warpers:
            logits = w(prefixes, logits)
        probs = logits.softmax(-1).double() * weights[:, None]  # (n_prefixes, V)
        marginals.append(probs.sum(0))
        nz = probs.nonzero()
        prefixes = torch.cat([prefixes[nz[:, 0]], nz[:, 1:]], dim=-1)
        weights = probs[nz[:, 0], nz[:, 1]]
    return marginals


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit; categories with expected count < 5 are pooled."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]]).double()
    exp = torch.cat([expected[big], expected[~big].sum()[None]]).double()
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2))


def test_sampling_keeps_the_target_distribution(trained):
    """Assisted sampling (temperature, top-k, top-p) matches the exact target distribution of each of the
    first four tokens, and so does plain sampling; the draft's candidates are really accepted."""
    target, draft, prompts = trained
    # a sharper copy of the target (same greedy tokens, a peaked distribution like a real LM's)
    sharp = copy.deepcopy(target)
    sharp.lm_head.weight.data *= 8
    draft.bind(sharp)
    try:
        configure(draft, num_tokens=3, threshold=0.0)
        ids = prompts[5:6]
        steps, runs = 4, 400
        sampling = dict(do_sample=True, temperature=0.7, top_k=8, top_p=0.9, max_new_tokens=steps)
        exact = exact_marginals(sharp, ids, steps, 0.7, 8, 0.9)
        torch.manual_seed(0)
        accepted, assisted_tokens = 0, []
        for _ in range(runs):
            out = sharp.generate(ids, assistant_model=draft, **sampling)
            assisted_tokens.append(out[0, ids.shape[1] :])
            accepted += steps - draft.last_assisted_stats["target_forwards"]  # one target token per forward
        assisted_tokens = torch.stack(assisted_tokens)  # (runs, steps)
        mask = torch.ones(runs, ids.shape[1], dtype=torch.long)
        plain_tokens = sharp.generate(ids.expand(runs, -1), attention_mask=mask, **sampling)[:, ids.shape[1] :]
    finally:
        draft.bind(target)
    assert accepted > runs // 2  # speculative sampling accepted many draft tokens
    for step in range(steps):
        for tokens in (assisted_tokens, plain_tokens):
            counts = torch.bincount(tokens[:, step], minlength=VOCAB).double()
            assert chi2_pvalue(counts, exact[step]) > 1e-3, step
            assert counts[exact[step] == 0].sum() == 0  # never a token outside top-k / top-p
    # a distribution that differs from the target's is detected by the same test
    shifted = torch.bincount(plain_tokens[:, 0], minlength=VOCAB).double().roll(1)
    assert chi2_pvalue(shifted, exact[0]) < 1e-3


def test_sampling_scores_are_full_vocabulary_with_a_reduced_draft_vocab():
    """A draft vocabulary smaller than the target's: scores span the target vocabulary (-inf outside)."""
    target, draft = make_pair("llama", draft_vocab_size=64)
    draft.set_vocab_mapping(torch.arange(0, 2 * 64, 2))
    configure(draft, num_tokens=3, threshold=0.0)
    torch.manual_seed(0)
    out = target.generate(random_prompts(1), assistant_model=draft, do_sample=True, temperature=1.0, max_new_tokens=12)
    assert out.shape[1] == 8 + 12
    ids = random_prompts(1)
    assert torch.equal(assisted(target, draft, ids, max_new_tokens=12), plain(target, ids, max_new_tokens=12))


# ---------------------------------------------------------------------------------------------- binding


def hook_counts(target):
    return [len(m._forward_hooks) for m in target.modules()]


def test_hooks_never_leak_and_memory_stays_bounded(trained):
    target, draft, prompts = trained
    configure(draft, num_tokens=5, threshold=0.0)
    ids = prompts[9:10]
    before = plain(target, ids, max_new_tokens=40)
    assisted(target, draft, ids, max_new_tokens=40)
    rows = draft._capture.rows
    assert sum(f.shape[1] for _, f in rows) <= 5 + 1  # at most the last verified block
    stats = draft.last_assisted_stats
    after = plain(target, ids, max_new_tokens=40)
    assert torch.equal(after, before)
    assert draft._capture.armed_end is None and sum(f.shape[1] for _, f in draft._capture.rows) <= 6
    assert draft.last_assisted_stats == stats  # the plain call is not counted into it


def test_unbind_and_rebind():
    target, draft = make_pair("llama")
    other = make_tiny_target("llama", seed=5)
    bare = hook_counts(other)
    draft.unbind()
    assert sum(hook_counts(target)) == 0 and draft.target is None
    ids = random_prompts(1, seed=3)
    # an unbound draft binds itself to the model whose assisted generation calls it
    assert torch.equal(assisted(target, draft, ids, max_new_tokens=8), plain(target, ids, max_new_tokens=8))
    assert draft.target is target and sum(hook_counts(target)) == 3
    draft.bind(target)  # binding again keeps one set of hooks
    assert sum(hook_counts(target)) == 3
    draft.bind(other)  # rebinding moves the hooks
    assert sum(hook_counts(target)) == 0 and sum(hook_counts(other)) == 3 and sum(bare) == 0
    ids = random_prompts(1, seed=7)
    assert torch.equal(assisted(other, draft, ids, max_new_tokens=12), plain(other, ids, max_new_tokens=12))
    with pytest.raises(RuntimeError, match="bound to"):  # generating with a target it is not bound to
        assisted(target, draft, ids, max_new_tokens=12)
    draft.unbind()
    assert sum(hook_counts(other)) == 0


def test_automodel_draft_works_as_users_write_it(tmp_path):
    """`draft = AutoModel.from_pretrained(repo)` then `target.generate(**inputs, assistant_model=draft)`, no bind."""
    target, draft = make_pair("llama", seed=4, draft_vocab_size=128)
    draft.set_vocab_mapping(torch.arange(3, 131))
    draft.save_pretrained(tmp_path / "draft", save_embeddings=False)  # as published: the target's embedding
    draft.unbind()
    loaded = AutoModel.from_pretrained(tmp_path / "draft", dtype=torch.float32)
    assert loaded.target is None
    inputs = {"input_ids": random_prompts(1, seed=11), "attention_mask": torch.ones(1, 8, dtype=torch.long)}
    out = target.generate(**inputs, assistant_model=loaded, do_sample=False, max_new_tokens=20)
    assert torch.equal(out, target.generate(**inputs, do_sample=False, max_new_tokens=20))
    assert loaded.target is target and torch.equal(loaded.embed_tokens.weight, target.get_input_embeddings().weight)
    assert loaded.last_assisted_stats["draft_rounds"] >= 2
    other = make_tiny_target("llama", seed=9)  # bound once: another model must bind it explicitly
    with pytest.raises(RuntimeError, match="bound to another model"):
        other.generate(**inputs, assistant_model=loaded, do_sample=False, max_new_tokens=4)


def test_deleted_draft_leaves_inert_hooks():
    target, draft = make_pair("llama")
    ids = random_prompts(1)
    ref = plain(target, ids, max_new_tokens=8)
    alive = weakref.ref(draft)
    del draft
    gc.collect()
    assert alive() is None  # the target's hooks do not keep the draft alive
    assert torch.equal(plain(target, ids, max_new_tokens=8), ref)


# ---------------------------------------------------------------------------------------------- errors


def test_clear_errors():
    target, draft = make_pair("llama")
    fresh = Eagle3DraftModel.from_target(target)
    assisting = GenerationConfig(is_assistant=True, max_new_tokens=2)
    with pytest.raises(RuntimeError, match="not bound.*not transformers' assisted generation.*bind"):
        fresh.generate(random_prompts(1), generation_config=assisting)  # called by hand: no model to bind to
    misfit = Eagle3DraftModel.from_target(make_tiny_target("llama", num_hidden_layers=8), aux_layer_ids=[1, 5, 7])
    with pytest.raises(ValueError, match="does not fit"):  # the automatic binding checks the fit first
        target.generate(random_prompts(1), assistant_model=misfit, max_new_tokens=4)
    assert misfit.target is None
    with pytest.raises(ValueError, match="cannot generate on its own"):
        draft.generate(random_prompts(1), max_new_tokens=4)
    for overrides in (dict(hidden_size=96), dict(num_hidden_layers=2), dict(vocab_size=300)):
        with pytest.raises(ValueError, match="does not fit"):
            Eagle3DraftModel.from_target(target).bind(make_tiny_target("llama", **overrides))
    # batch > 1: transformers refuses before asking the assistant
    with pytest.raises(ValueError, match="batch_size = 1"):
        target.generate(random_prompts(2), assistant_model=draft, max_new_tokens=4)
    padded = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match="unpadded"):
        target.generate(random_prompts(1), attention_mask=padded, assistant_model=draft, max_new_tokens=4)


# ---------------------------------------------------------------------------------------------- dtypes, devices


def test_bfloat16_runs_and_mostly_agrees(trained):
    target, draft, prompts = trained
    target16 = make_tiny_target("llama", dtype=torch.bfloat16)
    target16.load_state_dict(target.state_dict())
    draft16 = Eagle3DraftModel.from_target(target16).eval()
    draft16.load_state_dict(draft.state_dict())
    draft16.to(torch.bfloat16).bind(target16)
    configure(draft16, num_tokens=5, threshold=0.0)
    agree = total = 0
    for ids in prompts[:4]:
        ref = plain(target16, ids[None], max_new_tokens=20)
        out = assisted(target16, draft16, ids[None], max_new_tokens=20)
        assert out.shape == ref.shape
        same = (out == ref)[0].int().cumprod(0)
        agree, total = agree + int(same.sum()), total + out.shape[1]
    assert agree / total > 0.6
    assert draft16.last_assisted_stats["accepted_tokens"] > 0
    # a float32 draft on a bfloat16 target
    draft.bind(target16)
    try:
        out = assisted(target16, draft, prompts[:1], max_new_tokens=12)
        assert out.shape[1] == 8 + 12
    finally:
        draft.bind(target)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda(trained, dtype):
    target, draft, prompts = trained
    target_c = make_tiny_target("llama", dtype=dtype)
    target_c.load_state_dict(target.state_dict())
    target_c.to("cuda")
    draft_c = Eagle3DraftModel.from_target(target_c).eval()
    draft_c.load_state_dict(draft.state_dict())
    draft_c.to(device="cuda", dtype=dtype).bind(target_c)
    configure(draft_c, num_tokens=5, threshold=0.0)
    ids = prompts[:1].cuda()
    for kwargs in (dict(), dict(cache_implementation="static")):  # static: the target's decode step is compiled
        ref = plain(target_c, ids, max_new_tokens=20, **kwargs)
        try:
            out = assisted(target_c, draft_c, ids, max_new_tokens=20, **kwargs)
        except ValueError as e:  # transformers releases before static-cache assisted generation refuse it
            assert kwargs and "Static cache" in str(e)
            continue
        if dtype == torch.float32:
            assert torch.equal(out, ref)
        assert draft_c.last_assisted_stats["accepted_tokens"] > 0
    out = target_c.generate(ids, assistant_model=draft_c, do_sample=True, temperature=0.7, max_new_tokens=20)
    assert out.shape[1] == ids.shape[1] + 20


# ---------------------------------------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smollm2_with_draft(smollm2):
    """(target, tokenizer, draft): the real target (conftest.py) and an untrained draft bound to it."""
    target, tokenizer = smollm2
    torch.manual_seed(0)
    draft = Eagle3DraftModel.from_target(target, draft_vocab_size=4096).eval()
    draft.bind(target)
    yield target, tokenizer, draft
    draft.unbind()  # the target is shared with other tests


def chat_ids(tokenizer, text):
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)


def test_smollm2_greedy_lossless_and_streamer(smollm2_with_draft):
    target, tokenizer, draft = smollm2_with_draft
    configure(draft, num_tokens=3, threshold=0.0)
    for text in ("What is the capital of France?", "Write a haiku about the sea."):
        inputs = chat_ids(tokenizer, text)
        ref = target.generate(**inputs, max_new_tokens=16, do_sample=False)
        out = target.generate(**inputs, assistant_model=draft, max_new_tokens=16, do_sample=False)
        assert torch.equal(out, ref)
        check_stats(draft.last_assisted_stats, out.shape[1] - inputs["input_ids"].shape[1])
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    kwargs = dict(**inputs, assistant_model=draft, max_new_tokens=16, do_sample=False, streamer=streamer)
    thread = threading.Thread(target=target.generate, kwargs=kwargs)
    thread.start()
    text = "".join(streamer)
    thread.join()
    assert text == tokenizer.decode(ref[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    torch.manual_seed(0)
    out = target.generate(**inputs, assistant_model=draft, max_new_tokens=8, do_sample=True, temperature=0.7, top_p=0.9)
    assert out.shape[1] <= inputs["input_ids"].shape[1] + 8
