"""The EAGLE-3 draft as a transformers assistant: ``target.generate(ids, assistant_model=draft)``.

Shipped next to the weights (``trust_remote_code``): imports only torch and transformers.

How it fits into transformers' assisted generation (``AssistedCandidateGenerator``), batch size 1:

    round r:  draft.generate(input_ids (1, L))  ->  candidates (1, L + k), scores: k x (1, target_vocab)
              target forward over the new tokens  ->  accepts n <= k candidates, appends a bonus token
    round r+1: draft.generate(input_ids (1, L + n + 1)) ...

The draft needs the target's features (aux decoder layer outputs) at every position the target accepted.
transformers hands an assistant no target states, so ``bind(target)`` registers forward hooks on the
target's aux layers. An unbound draft binds itself on its first call, once, to the model whose assisted
generation calls it (after ``check_fits``; ``eagle3_hub.assisting_caller`` finds that model, the package's one
look at the call stack), so ``target.generate(ids, assistant_model=draft)`` works as written; a bound draft
never looks. Our ``generate`` *arms* the hooks for exactly the next target forward (the verification of its
candidates); that forward's features are kept (one block) and consumed by the next round.

Threads: what a call arms and captures, and its counts, belong to the thread that runs it (hooks run in the
thread of the forward that calls them), so one bound draft serves several threads at once: assisted calls,
tree decoding and plain forwards of the target. In a thread with no assisted call in progress the hooks return
at once; a pause of the hooks (``unbind(keep_target=True)``, as tree decoding does) leaves them in place while
another thread's call may still read them.

Draft KV cache: entries at positions < ``valid_length`` were computed from target features; entries after
that came from the draft's own hidden states and are dropped each round, then the positions the target
has just accepted are rebuilt from its features. (transformers crops an assistant's cache to L - 2, which
suits a normal LM, not a draft whose inputs change once the target has verified them.)

First round: the draft is asked before the target's prefill, so no features exist yet. It proposes one
placeholder candidate (the last prompt token) with one-hot scores: lossless for greedy and for sampling.

Scores: full target-vocabulary logits (tokens outside the draft vocabulary at -inf), after the target's
logits processors (temperature, top-k, top-p, ...). With ``do_sample`` the candidate is drawn from
softmax(scores), so transformers' speculative sampling keeps the target's distribution.
"""

from __future__ import annotations

import threading
import weakref

import torch
from transformers.cache_utils import DynamicCache
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.utils import GenerateDecoderOnlyOutput

BATCH_HELP = (
    "transformers' assisted generation (`target.generate(..., assistant_model=draft)`) handles one sequence "
    "at a time; for batches use `eagle3_hub.generate`."
)


def decoder_base(target):
    """The decoder stack (the module holding ``layers`` and the final ``norm``) of a causal LM."""
    base = target.get_decoder() if hasattr(target, "get_decoder") else getattr(target, "model", target)
    if getattr(base, "layers", None) is None and hasattr(base, "language_model"):
        base = base.language_model
    if getattr(base, "layers", None) is None:
        raise ValueError(f"Cannot find the decoder layers of {type(target).__name__}: expected `.model.layers`.")
    return base


def decoder_layers(target):
    """The list of decoder layers of a causal LM (Llama, Qwen, Mistral, Gemma, Phi-3, ...)."""
    return decoder_base(target).layers


def feature_modules(target, layer_ids: list[int]) -> list[torch.nn.Module]:
    """The module whose output is the feature of each aux layer id.

    Layer ``i`` gives HF's ``output_hidden_states[i + 1]``: the output of decoder layer ``i``, except for the
    last layer, whose HF hidden state is taken after the final norm (so we hook the norm there).
    """
    base = decoder_base(target)
    layers = base.layers
    modules = []
    for i in layer_ids:
        if i == len(layers) - 1 and isinstance(getattr(base, "norm", None), torch.nn.Module):
            modules.append(base.norm)
        else:
            modules.append(layers[i])
    return modules


class _Binding:
    """The feature hooks of one ``bind(target)``: shared by every thread, never changed after it is made."""

    def __init__(self, modules: list[torch.nn.Module], first_slot: int, handles: list):
        self.modules = [weakref.ref(m) for m in modules]
        self.num_slots = len(modules)
        self.first_slot = first_slot  # the slot whose module runs first in a forward
        self.handles = handles
        self.live: weakref.WeakSet = weakref.WeakSet()  # sessions of assisted calls that may still read the hooks

    def hooks(self, modules: list[torch.nn.Module]) -> bool:
        return len(modules) == self.num_slots and all(r() is m for r, m in zip(self.modules, modules))


class _FeatureCapture:
    """Target features captured for one assisted call, in the thread that runs it.

    ``armed_end``: sequence index of the last token of the next target forward, or None (forwards are then
    only counted, not stored). ``rows``: list of (start index, features (1, s, 3*Ht)) still to be consumed.
    """

    def __init__(self, binding: _Binding):
        self.binding = binding
        self.num_slots = binding.num_slots
        self.first_slot = binding.first_slot
        self.armed_end: int | None = None
        self.armed_for_recompute = False
        self.pending: dict[int, torch.Tensor | None] = {}
        self.first_position: int | None = None
        self.rows: list[tuple[int, torch.Tensor]] = []

    def arm(self, end: int, recompute: bool = False):
        self.armed_end = end
        self.armed_for_recompute = recompute
        self.pending = {}

    def clear(self):
        self.armed_end = None
        self.pending = {}
        self.rows = []

    def take(self, start: int, end: int, device) -> torch.Tensor | None:
        """Features of sequence indices ``start..end`` (1, end - start + 1, 3*Ht), or None if some are missing.
        Later captures of a position replace earlier ones. Consumed rows are dropped."""
        rows, self.rows = self.rows, []
        n = end - start + 1
        if rows and rows[-1][0] <= start and rows[-1][0] + rows[-1][1].shape[1] - 1 >= end:  # the usual case
            row_start, feats = rows[-1]
            return feats[:, start - row_start : end - row_start + 1].to(device)
        out, filled = None, torch.zeros(n, dtype=torch.bool)
        for row_start, feats in rows:
            lo, hi = max(start, row_start), min(end, row_start + feats.shape[1] - 1)
            if lo > hi:
                continue
            if out is None:
                out = feats.new_empty(1, n, feats.shape[-1])
            out[:, lo - start : hi - start + 1] = feats[:, lo - row_start : hi - row_start + 1]
            filled[lo - start : hi - start + 1] = True
        if out is None or not bool(filled.all()):
            return None
        return out.to(device)


class _AssistSession:
    """Bookkeeping of one ``target.generate(..., assistant_model=draft)`` call."""

    def __init__(self, generation_config, prompt_length: int):
        self.generation_config = generation_config  # the generator's copy: a new object per generate() call
        self.cache_ref = None  # weakref to the draft cache handed to the generator
        self.valid_length = 0  # draft cache entries computed from target features (positions 0..valid-1)
        self.prompt_length = prompt_length
        self.last_length = prompt_length  # input length of the last round
        self.last_drafted = 0  # candidates of the last round (0: the placeholder round)
        self.closed = False  # a forward that cannot belong to this call was seen
        self.target_forwards = 0
        self.extra_target_forwards = 0
        self.draft_forwards = 0
        self.rounds: list[dict] = []  # drafting rounds: input_length, drafted, accepted (None: not seen)

    def record_outcome(self, new_length: int):
        """The sequence has grown to ``new_length``: the target accepted ``new_length - L - 1`` candidates of
        the last round (input length L)."""
        if self.rounds and self.rounds[-1]["accepted"] is None:
            accepted = new_length - self.rounds[-1]["input_length"] - 1
            self.rounds[-1]["accepted"] = min(max(accepted, 0), self.rounds[-1]["drafted"])

    def stats(self) -> dict:
        seen = [r for r in self.rounds if r["accepted"] is not None]
        return {
            "prompt_length": self.prompt_length,
            "target_forwards": self.target_forwards,
            "extra_target_forwards": self.extra_target_forwards,
            "draft_forwards": self.draft_forwards,
            "draft_rounds": len(self.rounds),
            "drafted_tokens": sum(r["drafted"] for r in seen),
            "accepted_tokens": sum(r["accepted"] for r in seen),
            "pending_drafted_tokens": sum(r["drafted"] for r in self.rounds if r["accepted"] is None),
            "rounds": [dict(r) for r in self.rounds],
        }


class _CallState(threading.local):
    """One thread's assisted call on one draft: its capture and its counts."""

    capture: _FeatureCapture | None = None
    session: _AssistSession | None = None


# draft -> its per-thread call state; kept outside the module so that a copy of a draft (deepcopy) starts clean
_CALL_STATES: weakref.WeakKeyDictionary[torch.nn.Module, _CallState] = weakref.WeakKeyDictionary()
_LOCK = threading.RLock()  # call states, hooks added or removed, a call starting: one at a time


def _call_state(draft) -> _CallState:
    state = _CALL_STATES.get(draft)
    if state is None:
        with _LOCK:
            state = _CALL_STATES.setdefault(draft, _CallState())
    return state


class Eagle3AssistantMixin:
    """Feature hooks on the bound target and the ``generate`` that transformers' assisted generation calls."""

    _binding: _Binding | None = None

    @property
    def _hook_handles(self) -> list | None:
        return self._binding.handles if self._binding is not None else None

    @property
    def _capture(self) -> _FeatureCapture | None:
        """This thread's capture of the current binding (its last assisted call's, or a new one)."""
        state = _call_state(self)
        if self._binding is not None and (state.capture is None or state.capture.binding is not self._binding):
            state.capture = _FeatureCapture(self._binding)
        return state.capture

    @property
    def _assist_session(self) -> _AssistSession | None:
        return _call_state(self).session

    # ------------------------------------------------------------------ hooks
    def _register_feature_hooks(self, target):
        layer_ids = self.config.aux_layer_ids
        modules = feature_modules(target, layer_ids)
        with _LOCK:
            if self._binding is not None and self._binding.hooks(modules):
                return  # already hooked there: the hooks other threads' calls rely on stay in place
            self._remove_hooks()
            draft_ref = weakref.ref(self)
            handles = []
            for slot, module in enumerate(modules):
                handles.append(module.register_forward_hook(_make_feature_hook(draft_ref, slot), with_kwargs=True))
            self._binding = _Binding(modules, first_slot=layer_ids.index(min(layer_ids)), handles=handles)

    def _remove_hooks(self):
        for h in self._hook_handles or []:
            h.remove()
        self._binding = None

    def _on_target_feature(self, slot: int, module, output, kwargs):
        binding = self._binding
        if binding is None or binding.modules[slot]() is not module:  # e.g. a deepcopy of the target carries our hooks
            return
        state = _CALL_STATES.get(self)
        cap = state.capture if state is not None else None
        if cap is None or cap.binding is not binding:  # no assisted call of this binding in this thread
            return
        hidden = output[0] if isinstance(output, tuple) else output  # (1, s, Ht)
        if slot == cap.first_slot:  # a new forward starts
            cap.pending = {}
            position_ids = kwargs.get("position_ids")
            cap.first_position = int(position_ids.reshape(-1)[0]) if torch.is_tensor(position_ids) else None
        cap.pending[slot] = hidden.detach().clone() if cap.armed_end is not None else None  # unarmed: only counted
        if len(cap.pending) < cap.num_slots:
            return
        s = hidden.shape[1]
        if cap.armed_end is not None:
            feats = torch.cat([cap.pending[i] for i in range(cap.num_slots)], dim=-1)  # (1, s, 3*Ht)
            cap.rows.append((cap.armed_end - s + 1, feats))
            session = state.session
            if session is not None:
                if cap.armed_for_recompute:
                    session.extra_target_forwards += 1
                else:
                    session.target_forwards += 1
            cap.armed_end = None
        else:
            self._on_unarmed_forward(state.session, s, cap.first_position)
        cap.pending = {}

    def _on_unarmed_forward(self, session, num_tokens: int, first_position: int | None):
        """A target forward of this thread the draft did not ask for. The only one that belongs to an assisted
        call is its last round when one token was left (transformers then skips the assistant); anything else
        ends it."""
        if session is None or session.closed:
            return
        end = session.last_length + session.last_drafted  # the bonus token lies in last_length..end
        in_range = first_position is None or session.last_length <= first_position <= end
        if num_tokens == 1 and in_range:
            session.target_forwards += 1
            if first_position is not None:
                session.record_outcome(first_position + 1)
        session.closed = True

    def unbind(self, keep_target: bool = False):
        """Remove the feature hooks from the target and forget it. ``keep_target``: keep the target (tree decoding,
        which reads hidden states itself, pauses the hooks so); the hooks then stay while an assisted call of another
        thread may still read them, and the next assisted call puts them back."""
        with _LOCK:
            state = _CALL_STATES.get(self)
            mine = state.session if state is not None else None
            if state is not None:
                state.capture = state.session = None
            binding = self._binding
            in_use = binding is not None and any(s is not mine and not s.closed for s in list(binding.live))
            if not (keep_target and in_use):
                self._remove_hooks()
            if not keep_target:
                self._target_ref = None
        return self

    @property
    def last_assisted_stats(self) -> dict | None:
        """Counts of the last ``target.generate(..., assistant_model=draft)`` call (None before the first).

        ``target_forwards``: target forward passes of that call (prefill included); ``extra_target_forwards``:
        forwards the draft ran itself to recover missing features (0 in normal use); ``draft_forwards``:
        forward passes of the draft; ``drafted_tokens`` / ``accepted_tokens``: candidates proposed / accepted
        in rounds whose outcome the draft saw (the first-round placeholder excluded); ``pending_drafted_tokens``:
        candidates of the final round when its outcome is unknown (transformers does not call the assistant
        after it). ``rounds``: one dict per drafting round (``input_length``, ``drafted``, ``accepted`` or None).
        The mean number of tokens per target forward is ``new_tokens / target_forwards``. Per thread: the last
        call made in the thread that reads it.
        """
        session = self._assist_session
        return session.stats() if session is not None else None

    # ------------------------------------------------------------------ assisted generation
    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.LongTensor | None = None,
        generation_config=None,
        logits_processor=None,
        min_new_tokens: int = 0,
        max_new_tokens: int | None = None,
        cache=None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        **kwargs,
    ) -> GenerateDecoderOnlyOutput:
        """One drafting round, called by transformers' ``AssistedCandidateGenerator``.

        input_ids: (1, L) the whole sequence, ending with the target's latest token.
        Returns ``sequences`` (1, L + k), ``scores`` (k tensors (1, target_vocab)) and the draft ``cache``.
        """
        if generation_config is None or not getattr(generation_config, "is_assistant", False):
            raise ValueError(
                "An EAGLE-3 draft cannot generate on its own: it drafts from its target's features. Use "
                "`target.generate(ids, assistant_model=draft)` (after `draft.bind(target)`) or `eagle3_hub.generate`."
            )
        target = self.target
        if target is None:  # the caller did not bind it: the first call binds it, once, to the model that calls
            caller = _assisting_model(self)
            if caller is not None:
                with _LOCK:
                    if self.target is None:
                        self.bind(caller)  # fit-checked
                target = self.target
                if target is not caller:
                    raise RuntimeError(BOUND_ELSEWHERE)
        if target is not None and self._binding is None:  # bound, its hooks paused or removed: back on
            self._register_feature_hooks(target)
        if target is None or self._binding is None:
            raise RuntimeError(
                "This draft is not bound to a target, and the caller is not transformers' assisted generation, so the "
                "draft cannot tell whose features to read. Call `draft.bind(target)` (or load it with "
                "`from_pretrained(path, target=target)`), or call `target.generate(..., assistant_model=draft)`."
            )
        if input_ids.shape[0] != 1:
            raise ValueError(f"Got a batch of {input_ids.shape[0]} sequences: {BATCH_HELP}")
        if max_new_tokens is None or max_new_tokens < 1:
            max_new_tokens = 1
        if cache is None:  # earlier transformers 5.x releases name it past_key_values
            cache = past_key_values
        state = _call_state(self)
        cap, session = state.capture, state.session
        L = input_ids.shape[1]
        new_call = (
            session is None
            or cap is None
            or cap.binding is not self._binding
            or cache is None
            or session.cache_ref is None
            or session.cache_ref() is not cache
            or session.generation_config is not generation_config
        )
        if new_call:
            if attention_mask is not None and not bool(attention_mask.all()):
                raise ValueError(
                    "The EAGLE-3 assistant needs an unpadded sequence (the attention mask has zeros). "
                    f"Pass the prompt without padding; {BATCH_HELP}"
                )
            return self._placeholder_round(state, input_ids, generation_config)

        if cap.armed_end is not None:
            raise RuntimeError(
                BOUND_ELSEWHERE + " (the draft saw no forward pass of the target it is bound to since its last round)"
            )
        session.record_outcome(L)
        return self._draft_round(state, input_ids, generation_config, logits_processor, min_new_tokens, max_new_tokens, cache)

    def _placeholder_round(self, state: _CallState, input_ids, generation_config):
        """First round of a call: the target has not run yet. Propose the last token with one-hot scores."""
        L = input_ids.shape[1]
        session = _AssistSession(generation_config, prompt_length=L)
        with _LOCK:  # the hooks are not removed from under a call that has started
            if self._binding is None:
                self._register_feature_hooks(self.target)
            self._binding.live.add(session)
            state.session = session
            state.capture = _FeatureCapture(self._binding)
        token = input_ids[:, -1:]
        scores = torch.full((1, self.config.vocab_size), float("-inf"), device=input_ids.device)
        scores[0, token[0, 0]] = 0.0
        cache = DynamicCache()
        session.cache_ref = weakref.ref(cache)
        session.last_length, session.last_drafted = L, 0
        state.capture.arm(end=L)  # the target's prefill covers 0..L (placeholder included)
        return _round_output(torch.cat([input_ids, token], dim=-1), (scores,), cache)

    def _draft_round(
        self, state: _CallState, input_ids, generation_config, logits_processor, min_new_tokens, max_new_tokens, cache
    ):
        session, cap = state.session, state.capture
        L = input_ids.shape[1]
        device = self.fc.weight.device
        input_ids = input_ids.to(device)

        # 1. Draft cache: keep the entries built from target features, drop the draft's own.
        valid = min(session.valid_length, cache.get_seq_length(), L - 2)
        if cache.get_seq_length() > valid:
            cache.crop(-(cache.get_seq_length() - valid))

        # 2. Target features of the positions accepted since: valid..L-2 (the last token, L-1, is not verified).
        feats = cap.take(valid, L - 2, device)
        if feats is None:  # a target forward the hooks did not see (e.g. a prefilled cache): run the target once
            cap.clear()
            cap.arm(end=L - 2, recompute=True)
            target = self.target
            extra = {"logits_to_keep": 1} if target._supports_logits_to_keep() else {}
            target(input_ids=input_ids[:, : L - 1].to(target.device), use_cache=False, **extra)
            feats = cap.take(valid, L - 2, device)
            if feats is None:
                raise RuntimeError("The target's forward pass did not reach the draft's feature hooks.")

        # 3. Rebuild the accepted positions (feature t with token t+1 at position t); predicts token L.
        positions = torch.arange(valid, L - 1, device=device).unsqueeze(0)  # (1, L-1-valid)
        out = self(
            input_ids=input_ids[:, valid + 1 : L],
            target_hidden_states=feats,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        session.draft_forwards += 1
        session.valid_length = L - 1

        # 4. Draft up to max_new_tokens, each step feeding back the draft's own hidden state.
        processors = LogitsProcessorList(logits_processor or [])
        do_sample = bool(generation_config.do_sample)
        eos = _eos_ids(generation_config, device)
        threshold = getattr(generation_config, "assistant_confidence_threshold", None)
        target_ids = self.draft_to_target_ids(torch.arange(self.config.draft_vocab_size, device=device))
        sequences, all_scores = input_ids, []
        hidden, logits = out.hidden_states[:, -1:], out.logits[:, -1]  # (1, 1, H), (1, draft_vocab)
        for step in range(max_new_tokens):
            scores = torch.full((1, self.config.vocab_size), float("-inf"), device=device)
            scores[:, target_ids] = logits.float()
            scores = processors(sequences, scores)
            if eos is not None and step < min_new_tokens:
                scores[:, eos] = float("-inf")
            if not bool(torch.isfinite(scores).any()):  # the processors ruled out the whole draft vocabulary
                if step > 0:
                    break
                scores = torch.full_like(scores, float("-inf"))
                scores[0, sequences[0, -1]] = 0.0  # a one-hot candidate, like the placeholder round
            probs = scores.softmax(dim=-1)
            token = torch.multinomial(probs, 1) if do_sample else scores.argmax(dim=-1, keepdim=True)  # (1, 1)
            sequences = torch.cat([sequences, token], dim=-1)
            all_scores.append(scores)
            if step + 1 == max_new_tokens:
                break
            if eos is not None and step + 1 >= min_new_tokens and bool(torch.isin(token, eos).any()):
                break  # the target stops here if it accepts it
            if threshold is not None and threshold > 0 and float(probs[0, token[0, 0]]) < threshold:
                break  # transformers' ConfidenceCriteria for assistants
            out = self(
                input_ids=token,
                hidden_states=hidden,
                position_ids=torch.full((1, 1), L - 1 + step, device=device),
                cache=cache,
                use_cache=True,
            )
            session.draft_forwards += 1
            hidden, logits = out.hidden_states, out.logits[:, -1]

        k = len(all_scores)
        session.rounds.append({"input_length": L, "drafted": k, "accepted": None})
        session.last_length, session.last_drafted = L, k
        cap.arm(end=L + k - 1)  # the verification forward covers L-1..L+k-1
        return _round_output(sequences, tuple(all_scores), cache)


def _round_output(sequences, scores, cache) -> GenerateDecoderOnlyOutput:
    """The output transformers' candidate generator reads; its cache field is ``cache`` in recent transformers
    releases, ``past_key_values`` in earlier ones (5.17, for one)."""
    name = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, **{name: cache})


def _eos_ids(generation_config, device) -> torch.Tensor | None:
    eos = getattr(generation_config, "_eos_token_tensor", None)
    if eos is None and generation_config.eos_token_id is not None:
        eos = generation_config.eos_token_id
    if eos is None:
        return None
    return torch.as_tensor(eos, device=device).reshape(-1)


BOUND_ELSEWHERE = (
    "This draft is bound to another model than the one calling it: call `draft.bind(target)` for the model you "
    "generate with (a draft follows one target at a time)"
)


def _assisting_model(draft):
    """The model whose assisted generation is asking the unbound ``draft`` for candidates, or None.

    transformers hands an assistant no reference to that model; ``eagle3_hub.assisting_caller`` finds it on the
    call stack. A copy of this file shipped as remote code, without the package, binds only explicitly."""
    try:
        from eagle3_hub.assisting_caller import assisting_model
    except ImportError:
        return None
    return assisting_model(draft)


def _make_feature_hook(draft_ref, slot: int):
    """A forward hook that hands the module output to the draft (held by weakref: the target must not keep a
    deleted draft alive). Runs eagerly under torch.compile, so captures are real copies."""

    @torch.compiler.disable
    def hook(module, args, kwargs, output):
        draft = draft_ref()
        if draft is not None:
            draft._on_target_feature(slot, module, output, kwargs)

    return hook
