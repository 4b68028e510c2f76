"""The entry points: ``generate`` (the Python API) and ``tree_generate`` (for
``target.generate(ids, custom_generate=tree_generate, draft=...)``), with their checks and the draft loading."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import LogitsProcessorList, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StopStringCriteria

from .acceptance import Processing, sampling_warpers
from .config import TreeConfig
from .decode import TreeDecoder
from .oracle import TargetProposer
from .outputs import TreeDecodingOutput, TreeDecodingStats
from .paused_hooks import PausedFeatureHooks


def generate(
    target,
    draft,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 256,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    stop_strings: str | list[str] | None = None,
    tokenizer=None,
    streamer=None,
    depth: int | None = None,
    tree_top_k: int | None = None,
    total_tokens: int | None = None,
    lookup_tokens: int | None = None,
    on_step: Callable[[list[list[int]], list[int]], None] | None = None,
    generator: torch.Generator | None = None,
    draft_graph: bool | None = None,
    min_node_prob: float | None = None,
    grow_min_prob: float | None = None,
    config: TreeConfig | None = None,
    trust_remote_code: bool = False,
    adaptive: bool | None = None,
    proposer: str = "draft",
    draft_sampling: bool | None = None,
    draft_int8: bool | None = None,
) -> TreeDecodingOutput:
    """EAGLE tree decoding of ``target`` with ``draft``; equal to ``target.generate`` in distribution (token
    for token when greedy, up to floating-point ties).

    Args:
        target: a transformers causal LM. draft: an ``Eagle3DraftModel`` for it (or a repo id / folder).
        input_ids: (b, L), left-padded when b > 1; attention_mask: (b, L) 1 = token, 0 = padding.
        max_new_tokens: new tokens per row.
        do_sample / temperature / top_k / top_p: as in transformers (top_k=0 and top_p=1.0 disable them).
        eos_token_id: stop ids (default: the target's generation config); stop_strings: needs ``tokenizer``.
        streamer: a transformers streamer (batch size 1); receives the prompt, then each accepted block.
        depth / tree_top_k / total_tokens / lookup_tokens / draft_graph / min_node_prob / grow_min_prob: the
            tree's shape, as in ``TreeConfig``; they override the fields of ``config``; ``None`` = the default for
            the target's device and dtype.
        adaptive: choose each step's tree at run time from the running acceptance and the machine's measured
            costs, down to no tree (``TreeConfig.adaptive``); default: on unless depth / tree_top_k /
            total_tokens is given.
        draft_sampling: when sampling, draw each node's children from the draft's distribution rather than take its
            most probable tokens (``TreeConfig.draft_sampling``); default: on when sampling, except with ``draft_graph``.
        draft_int8: on a CPU, run the draft's products on int8 weights (``TreeConfig.draft_int8``); default off.
        proposer: ``"draft"``, or ``"target"``: the target proposes every node's children itself, its own most
            probable tokens (``oracle.TargetProposer``), so the acceptance is the most this tree shape and walk can
            reach with a perfect draft's top tokens (one-hot children: ``draft_sampling`` is off); for measurement
            only (each tree level runs the target: its speed means nothing), and with a fixed shape.
        on_step: ``on_step(tokens, num_from_draft)`` after every target forward: per row the tokens it just
            committed and how many of them came from the draft tree or the lookup branch (the rest: the
            target's bonus token).
        generator: a ``torch.Generator`` for sampling.
        config: a ``TreeConfig``.
        trust_remote_code: a ``draft`` given as a repo id / folder of another model type than ours may run the
            code it ships only with ``True`` (as in transformers); ours loads without it.

    Returns ``TreeDecodingOutput(sequences (b, L + new), stats)``; rows that stopped are right-padded.
    """
    _check_call(target, input_ids, max_new_tokens)
    if do_sample:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    processors = sampling_warpers(do_sample, temperature, top_k, top_p)
    if eos_token_id is None:
        eos_token_id = getattr(target.generation_config, "eos_token_id", None)
    criteria = []
    if stop_strings:
        if tokenizer is None:
            raise ValueError("stop_strings need the target's tokenizer: pass tokenizer=...")
        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    config = (config or TreeConfig()).replace(
        depth=depth,
        tree_top_k=tree_top_k,
        total_tokens=total_tokens,
        lookup_tokens=lookup_tokens,
        min_node_prob=min_node_prob,
        grow_min_prob=grow_min_prob,
        draft_graph=draft_graph,
        adaptive=adaptive,
        draft_sampling=draft_sampling,
        draft_int8=draft_int8,
    )
    return _run(
        target,
        draft,
        input_ids,
        attention_mask,
        config,
        Processing(processors, do_sample, generator),
        max_new_tokens=max_new_tokens,
        eos_ids=_as_id_list(eos_token_id),
        pad_id=getattr(target.generation_config, "pad_token_id", None),
        criteria=criteria,
        streamer=streamer,
        on_step=on_step,
        trust_remote_code=trust_remote_code,
        proposer=proposer,
    )


def tree_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config,
    draft=None,
    eagle_streamer=None,
    depth: int | None = None,
    tree_top_k: int | None = None,
    total_tokens: int | None = None,
    lookup_tokens: int | None = None,
    on_step: Callable | None = None,
    generator: torch.Generator | None = None,
    draft_graph: bool | None = None,
    min_node_prob: float | None = None,
    grow_min_prob: float | None = None,
    tree_config: TreeConfig | None = None,
    adaptive: bool | None = None,
    draft_sampling: bool | None = None,
    draft_int8: bool | None = None,
    **model_kwargs,
):
    """``target.generate(ids, custom_generate=tree_generate, draft=draft, ...)``.

    transformers builds the logits processors (temperature, top-k, top-p, repetition penalty, ...) and
    stopping criteria from the generation config and hands them here; it drops ``streamer`` for a
    custom_generate callable, so pass one as ``eagle_streamer``. Returns the sequences, or a
    ``TreeDecodingOutput`` with ``return_dict_in_generate=True``. Stop strings need a ``StopStringCriteria``
    in ``stopping_criteria`` (transformers does not hand the tokenizer to a custom_generate callable). The tree's
    shape: the keywords of ``generate``, or ``tree_config=TreeConfig(...)`` (``config`` there would read as the
    model's). A ``draft`` given as a repo id / folder must be of our type: transformers keeps the caller's
    ``trust_remote_code`` to itself here.
    """
    if getattr(generation_config, "num_beams", 1) > 1:
        raise ValueError("Tree decoding does not do beam search: use num_beams=1.")
    max_new_tokens = max(int(generation_config.max_length) - input_ids.shape[1], 0)
    eos_ids = _as_id_list(getattr(generation_config, "_eos_token_tensor", None))
    if not eos_ids:
        eos_ids = _as_id_list(generation_config.eos_token_id)
    pad = getattr(generation_config, "_pad_token_tensor", None)
    pad_id = int(pad.flatten()[0]) if isinstance(pad, torch.Tensor) else generation_config.pad_token_id
    criteria = [c for c in stopping_criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
    config = (tree_config or TreeConfig()).replace(
        depth=depth,
        tree_top_k=tree_top_k,
        total_tokens=total_tokens,
        lookup_tokens=lookup_tokens,
        min_node_prob=min_node_prob,
        grow_min_prob=grow_min_prob,
        draft_graph=draft_graph,
        adaptive=adaptive,
        draft_sampling=draft_sampling,
        draft_int8=draft_int8,
    )
    processing = Processing(logits_processor, bool(generation_config.do_sample), generator)
    out = _run(
        model,
        draft,
        input_ids,
        model_kwargs.get("attention_mask"),
        config,
        processing,
        max_new_tokens=max_new_tokens,
        eos_ids=eos_ids,
        pad_id=pad_id,
        criteria=criteria,
        streamer=eagle_streamer,
        on_step=on_step,
    )
    return out if generation_config.return_dict_in_generate else out.sequences


def attention_kernels(device: torch.device | str):
    """On CUDA, scaled-dot-product attention without the cuDNN kernel (a context manager; a no-op elsewhere).
    cuDNN attention builds an execution plan for every new (query length, key length) pair, and decoding meets a
    new key length at every step; the flash and memory-efficient kernels need no plan. Tree decoding runs under
    it; the benchmark runs every method under it, so that all compare on the same kernels."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _run(
    target,
    draft,
    input_ids,
    attention_mask,
    config: TreeConfig,
    processing: Processing,
    *,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int | None,
    criteria: list,
    streamer,
    on_step,
    trust_remote_code: bool | None = False,
    proposer: str = "draft",
) -> TreeDecodingOutput:
    if proposer not in ("draft", "target"):
        raise ValueError(f"proposer must be 'draft' or 'target', got {proposer!r}")
    if proposer == "target":  # the ceiling of one fixed shape
        config = config.replace(adaptive=False, draft_sampling=False)  # its proposals are one-hot
    _check_call(target, input_ids, max_new_tokens)
    draft = _prepare_draft(draft, target, trust_remote_code)
    input_ids, attention_mask = _check_prompt(target, input_ids, attention_mask, max_new_tokens, streamer)
    weight = target.get_input_embeddings().weight
    config = config.resolve(
        weight.device, weight.dtype, processing.do_sample, draft.config.draft_vocab_size, batch=input_ids.shape[0]
    )
    if pad_id is None:
        pad_id = eos_ids[0] if eos_ids else 0
    if max_new_tokens == 0:
        if streamer is not None:
            streamer.end()
        return TreeDecodingOutput(sequences=input_ids.clone(), stats=TreeDecodingStats())

    decoder = TreeDecoder(
        target,
        draft,
        config,
        processing,
        eos_ids=eos_ids,
        pad_id=pad_id,
        max_new_tokens=max_new_tokens,
        criteria=criteria,
        streamer=streamer,
        on_step=on_step,
    )
    if proposer == "target":
        pads = (~attention_mask.bool()).sum(-1).tolist()  # left padding
        decoder.drafter = TargetProposer(decoder, target, config, processing, decoder.stats, pads)
    was_training = (target.training, draft.training)
    target.eval()
    draft.eval()
    try:
        with PausedFeatureHooks(draft), torch.inference_mode(), attention_kernels(weight.device):
            rows = decoder.run(input_ids, attention_mask)
    finally:
        target.train(was_training[0])
        draft.train(was_training[1])
        if streamer is not None:
            streamer.end()
    sequences = torch.tensor(rows, dtype=torch.long, device=weight.device)  # a normal tensor (outside inference mode)
    return TreeDecodingOutput(sequences=sequences, stats=decoder.stats)


# ------------------------------------------------------------------------------------------------ checks
def _check_call(target, input_ids, max_new_tokens):
    """The arguments every entry point needs before anything else reads them: one clear error each."""
    if target is None or not hasattr(target, "get_input_embeddings") or not hasattr(target, "config"):
        raise ValueError(
            f"target must be a transformers causal LM (e.g. AutoModelForCausalLM.from_pretrained(...)), got "
            f"{type(target).__name__}."
        )
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(
            f"input_ids must be a tensor of token ids (batch, prompt_len), got {type(input_ids).__name__}: use "
            "tokenizer(..., return_tensors='pt') or torch.tensor([ids])."
        )
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}.")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}: e.g. max_new_tokens=256.")


def _check_prompt(target, input_ids, attention_mask, max_new_tokens, streamer):
    """-> (input_ids, attention_mask) (b, L) on the target's device, checked against the target's context."""
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be (batch, prompt_len) with batch >= 1 and prompt_len >= 1, got shape "
            f"{tuple(input_ids.shape)}: pass at least one non-empty prompt."
        )
    device = target.get_input_embeddings().weight.device
    input_ids = input_ids.to(device=device, dtype=torch.long)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = attention_mask.to(device)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} must have the shape of input_ids {tuple(input_ids.shape)}"
        )
    if bool((attention_mask[:, -1] == 0).any()):
        raise ValueError(
            "Tree decoding needs left padding (the last prompt position of every row must be a token): "
            "use tokenizer(..., padding_side='left')."
        )
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError("Streaming works with one prompt at a time (batch size 1), like transformers' streamers.")
    context = getattr(target.config.get_text_config(), "max_position_embeddings", None)
    prompt_len = int(attention_mask.sum(-1).max())
    if context is not None and prompt_len >= context:
        raise ValueError(
            f"The prompt has {prompt_len} tokens but the target's context is {context} positions: shorten the prompt."
        )
    if context is not None and prompt_len + max_new_tokens > context:
        warnings.warn(
            f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) exceeds the target's context ({context}); "
            "quality may degrade past it.",
            stacklevel=4,
        )
    return input_ids, attention_mask


def check_draft_fits_target(draft, target):
    """Raise a clear ``ValueError`` when ``draft`` was not made for ``target``: the draft's own ``check_fits`` (the
    rule, in modeling_eagle3.py), or for a draft whose modeling code predates it, the same checks made here."""
    if callable(getattr(draft, "check_fits", None)):
        draft.check_fits(target)
        return
    cfg = target.config.get_text_config()
    dc = draft.config
    problems = []
    if getattr(dc, "target_hidden_size", None) != cfg.hidden_size:
        problems.append(
            f"the draft reads target features of width {getattr(dc, 'target_hidden_size', None)}, the target's "
            f"hidden size is {cfg.hidden_size}"
        )
    if dc.vocab_size != cfg.vocab_size:
        problems.append(f"the draft maps to a vocabulary of {dc.vocab_size} tokens, the target has {cfg.vocab_size}")
    ids = list((getattr(dc, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids") or [])
    L = cfg.num_hidden_layers
    if len(ids) != 3 or any(not 0 <= int(i) < L for i in ids):
        problems.append(f"the draft's aux layers {ids} do not exist in a target with {L} decoder layers")
    d2t = getattr(draft, "d2t", None)
    if isinstance(d2t, torch.Tensor) and d2t.numel() and not d2t.is_meta:
        target_ids = d2t + torch.arange(d2t.numel(), device=d2t.device)
        if int(target_ids.min()) < 0 or int(target_ids.max()) >= cfg.vocab_size:
            problems.append(f"its d2t map sends draft ids outside the target's {cfg.vocab_size} tokens")
    if problems:
        raise ValueError("This draft does not fit the target: " + "; ".join(problems) + ". Use a draft trained for this target.")


def _prepare_draft(draft, target, trust_remote_code: bool | None = False):
    if draft is None:
        raise ValueError(
            "Tree decoding needs an EAGLE-3 draft: pass `draft=` (a loaded Eagle3DraftModel, or a repo id / folder)."
        )
    if isinstance(draft, (str, Path)):
        draft = load_draft(str(draft), target, trust_remote_code=trust_remote_code)
    if not hasattr(draft, "d2t") or not hasattr(draft.config, "aux_layer_ids"):
        raise ValueError(f"`draft` must be an EAGLE-3 draft (Eagle3DraftModel), got {type(draft).__name__}")
    check_draft_fits_target(draft, target)
    t_dev = target.get_input_embeddings().weight.device
    d_dev = draft.lm_head.weight.device
    if t_dev != d_dev:
        raise ValueError(f"The draft is on {d_dev} and the target on {t_dev}: move both to the same device.")
    return draft


def _as_id_list(ids) -> list[int]:
    if ids is None:
        return []
    if isinstance(ids, torch.Tensor):
        return [int(i) for i in ids.flatten().tolist()]
    if isinstance(ids, int):
        return [ids]
    return [int(i) for i in ids]


# ------------------------------------------------------------------------------------------------ loading
_LOADED_DRAFTS: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def _our_draft_class():
    """``Eagle3DraftModel`` when the eagle3_hub package is importable (a Hub copy of this file may run without it)."""
    try:
        from eagle3_hub import Eagle3DraftModel  # the package's name: wires the published layouts in too
    except ImportError:
        return None
    return Eagle3DraftModel


def load_draft(
    repo: str,
    target,
    revision: str | None = None,
    trust_remote_code: bool | None = False,
    *,
    bind: bool = False,
    assist: bool = False,
):
    """Load (once per target) the EAGLE-3 draft stored in ``repo`` (a Hub id or a folder), on the target's device
    and dtype: the one draft loader of eagle3-hub (tree decoding, ``custom_generate``, the bench, the demo, training).

    Code from ``repo`` runs only with the caller's ``trust_remote_code=True``: a draft of our own type loads
    through ``Eagle3DraftModel`` when the package is installed, anything else needs the caller's consent.
    ``bind=True``: also ``draft.bind(target)`` (the fit check, and the target's embedding where the draft has none)
    without the feature hooks, which tree decoding does not read and which would tax every other target forward;
    ``assist=True``: bound with the hooks, for ``target.generate(assistant_model=draft)``."""
    per_target = _LOADED_DRAFTS.setdefault(target, {})
    key = (repo, revision, trust_remote_code)
    if key not in per_target:
        per_target[key] = _read_draft(repo, target, revision, trust_remote_code)
    draft = per_target[key]
    if (bind or assist) and callable(getattr(draft, "bind", None)):
        draft.bind(target)
        if not assist:
            draft.unbind(keep_target=True)
    elif bind or assist:
        check_draft_fits_target(draft, target)
    return draft


def _read_draft(repo: str, target, revision: str | None, trust_remote_code: bool | None):
    from transformers import AutoModel, PretrainedConfig

    weight = target.get_input_embeddings().weight
    kwargs = {"revision": revision} if revision else {}
    config, _ = PretrainedConfig.get_config_dict(repo, **kwargs)  # reads config.json, runs nothing
    ours = _our_draft_class()
    model_type, auto_map = config.get("model_type"), config.get("auto_map")
    # speculators writes auto_map {"": "config.Eagle3SpeculatorConfig"} (its config class, no model code) and no
    # model_type: a layout our class reads, so nothing from the folder needs to run
    known_layout = config.get("speculators_model_type") == "eagle3"
    if ours is not None and (model_type == ours.config_class.model_type or not auto_map or known_layout):
        draft = ours.from_pretrained(repo, dtype=weight.dtype, **kwargs)  # our class: no code from the folder
    elif trust_remote_code or not auto_map:
        draft = AutoModel.from_pretrained(repo, trust_remote_code=trust_remote_code, dtype=weight.dtype, **kwargs)
    else:
        raise ValueError(
            f"The draft {repo} needs remote code to load (its config.json has model_type {model_type!r} and an "
            "auto_map): if you trust the code in it, pass trust_remote_code=True, or load it yourself with "
            "AutoModel.from_pretrained(repo, trust_remote_code=True) and pass the model as draft=."
        )
    return draft.to(weight.device).eval().requires_grad_(False)
