"""``eagle3-hub bench``: decoding methods side by side on question suites.

Methods (``--methods``):

- ``plain``: ``target.generate`` (greedy or sampling). Always run: every speed-up is measured against it, in
  the same run.
- ``same_forward``: plain decoding, one token per step, through the target forward and output head that tree
  decoding verifies with (``same_forward``); speed-ups against it (``speedup_same_forward``) are what
  speculation buys on its own.
- ``lookup``: transformers' prompt-lookup decoding (``prompt_lookup_num_tokens``).
- ``assisted``: our EAGLE-3 draft as a transformers assistant (``assistant_model=draft``).
- ``tree``: our EAGLE-3 tree decoding (``eagle3_hub.generation.tree.generate``).
- ``assistant``: any small causal LM as a classic assistant (``--assistant-model``).

Measurement: methods are interleaved per question (their order rotates from one question to the next) after a
warm-up, so machine drift and caching effects spread evenly over the methods. Forward hooks on the target and
the draft give the time split (draft / verify / the rest) and, from where each target forward starts, how many
draft tokens each step accepted. Greedy outputs of every method are compared token by token with plain greedy.
On CUDA every method runs on the same attention kernels, without cuDNN's (``attention_kernels``: its per-shape
plans slow plain ``generate`` down far more than the other methods, which would inflate every speed-up).

The command line (``eagle3-hub bench``) is ``eagle3_hub.commands.bench``; this module is the library it calls, with
``options`` (the method names and tree settings), ``models`` (loading the target and its drafts), ``instruments`` (the
hooks and clocks each run is measured with) and ``records`` (what each turn measured and the run's summaries).
"""

from __future__ import annotations

import copy
import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..generation.tree import attention_kernels
from ..modeling_eagle3 import non_finite_tensors
from .instruments import ForwardStarts, ForwardTimer, PeakMemory, sync
from .machine import machine_info
from .near_ties import near_tie_check, reduced_precision
from .options import DRAFT_METHODS, METHOD_NAMES, TREE_KEYS
from .records import TurnRecord, histogram, lossless_check, summarize, sweep_summary
from .suites import Suite

BATCHED_KINDS = ("plain", "same_forward", "tree", "oracle")
TREE_KINDS = ("tree", "oracle")  # tree decoding: its stats give the accepted tokens and the shape


# ----------------------------------------------------------------------------------------- methods
@dataclass
class Mode:
    """Greedy (temperature 0) or sampling."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def name(self) -> str:
        return "greedy" if self.greedy else f"T={self.temperature:g}"


@dataclass
class Method:
    """``run(input_ids, attention_mask, generation_config) -> (sequences (1, L), stats or None)``."""

    name: str
    kind: str  # plain, same_forward, lookup, assisted, tree, assistant
    run: Callable
    tree_params: dict | None = None

    @property
    def batched(self) -> bool:
        """Runs several left-padded prompts at once (transformers' assisted and prompt-lookup decoding take one)."""
        return self.kind in BATCHED_KINDS


@dataclass
class BenchContext:
    target: torch.nn.Module
    tokenizer: object
    draft: torch.nn.Module | None = None
    assistant: torch.nn.Module | None = None
    assistant_tokenizer: object = None
    lookup_tokens: int = 10
    # more drafts for the same target, each run as its own tree method (`tree@NAME`) on the same questions
    compare_drafts: dict = field(default_factory=dict)


def build_methods(
    names: list[str],
    ctx: BenchContext,
    tree_grid: list[dict] | None = None,
) -> list[Method]:
    """``names`` in METHOD_NAMES; ``tree_grid``: tree settings (``TREE_KEYS``) for ``tree``;
    several settings give one method each (the sweep)."""
    target = ctx.target
    methods: list[Method] = []
    for name in names:
        if name == "plain":
            methods.append(
                Method(
                    "plain",
                    "plain",
                    lambda ids, mask, gc: (target.generate(ids, attention_mask=mask, generation_config=gc), None),
                )
            )
        elif name == "same_forward":
            from ..generation.tree.same_forward import same_forward_generate

            def run_same_forward(ids, mask, gc):
                return same_forward_generate(
                    target,
                    ids,
                    gc.max_new_tokens,
                    attention_mask=mask,
                    pad_token_id=gc.pad_token_id,
                    do_sample=gc.do_sample,
                    temperature=gc.temperature if gc.do_sample else 1.0,
                    top_k=(gc.top_k or 0) if gc.do_sample else 0,
                    top_p=gc.top_p if gc.do_sample else 1.0,
                    eos_token_id=gc.eos_token_id,
                )

            methods.append(Method("same_forward", "same_forward", run_same_forward))
        elif name == "lookup":
            n = ctx.lookup_tokens

            def run_lookup(ids, mask, gc, n=n):
                gc = copy.copy(gc)
                gc.prompt_lookup_num_tokens = n
                return target.generate(ids, attention_mask=mask, generation_config=gc), None

            methods.append(Method("lookup", "lookup", run_lookup))
        elif name == "assisted":
            draft = ctx.draft

            def run_assisted(ids, mask, gc, draft=draft):
                return target.generate(ids, attention_mask=mask, generation_config=gc, assistant_model=draft), None

            methods.append(Method("assisted", "assisted", run_assisted))
        elif name == "assistant":
            assistant = ctx.assistant
            extra = {}
            if ctx.assistant_tokenizer is not None:  # different vocabularies: universal assisted decoding
                extra = dict(tokenizer=ctx.tokenizer, assistant_tokenizer=ctx.assistant_tokenizer)

            def run_assistant(ids, mask, gc, assistant=assistant, extra=extra):
                return target.generate(ids, attention_mask=mask, generation_config=gc, assistant_model=assistant, **extra), None

            methods.append(Method("assistant", "assistant", run_assistant))
        elif name == "tree":
            from ..generation.tree import generate

            grid = tree_grid or [{}]
            for (name, tree_draft), params in itertools.product([(None, ctx.draft), *ctx.compare_drafts.items()], grid):
                label = ("tree" if len(grid) == 1 else tree_label(params)) + (f"@{name}" if name else "")

                def run_tree(ids, mask, gc, params=params, tree_draft=tree_draft):
                    out = generate(
                        target,
                        tree_draft,
                        ids,
                        attention_mask=mask,
                        max_new_tokens=gc.max_new_tokens,
                        do_sample=gc.do_sample,
                        temperature=gc.temperature if gc.do_sample else 1.0,
                        top_k=(gc.top_k or 0) if gc.do_sample else 0,
                        top_p=gc.top_p if gc.do_sample else 1.0,
                        eos_token_id=gc.eos_token_id,
                        tokenizer=ctx.tokenizer,
                        depth=params.get("depth"),
                        tree_top_k=params.get("tree_top_k"),
                        total_tokens=params.get("total_tokens"),
                        lookup_tokens=params.get("lookup_tokens"),
                        min_node_prob=params.get("min_node_prob"),
                        grow_min_prob=params.get("grow_min_prob"),
                        adaptive=None if params.get("adaptive") is None else bool(params["adaptive"]),
                        draft_sampling=None if params.get("draft_sampling") is None else bool(params["draft_sampling"]),
                        draft_int8=None if params.get("draft_int8") is None else bool(params["draft_int8"]),
                    )
                    return out.sequences, out.stats

                methods.append(Method(label, "tree", run_tree, tree_params=dict(params)))
        elif name == "oracle":  # the acceptance a perfect draft would reach with each tree shape (not its speed)
            from ..generation.tree import generate

            grid = tree_grid or [{}]
            for params in grid:
                label = "oracle" if len(grid) == 1 else "oracle" + tree_label(params)[len("tree") :]

                def run_oracle(ids, mask, gc, params=params):
                    out = generate(
                        target,
                        ctx.draft,
                        ids,
                        attention_mask=mask,
                        max_new_tokens=gc.max_new_tokens,
                        do_sample=gc.do_sample,
                        temperature=gc.temperature if gc.do_sample else 1.0,
                        top_k=(gc.top_k or 0) if gc.do_sample else 0,
                        top_p=gc.top_p if gc.do_sample else 1.0,
                        eos_token_id=gc.eos_token_id,
                        tokenizer=ctx.tokenizer,
                        proposer="target",
                        **{
                            k: params.get(k)
                            for k in ("depth", "tree_top_k", "total_tokens", "lookup_tokens", "min_node_prob", "grow_min_prob")
                        },
                    )
                    return out.sequences, out.stats

                methods.append(Method(label, "oracle", run_oracle, tree_params=dict(params)))
        else:
            raise ValueError(f"Unknown method '{name}': choose from {', '.join(METHOD_NAMES)}")
    return methods


def tree_label(params: dict) -> str:
    parts = [f"{k}={params[k]}" for k in TREE_KEYS if params.get(k) is not None]
    return "tree[" + ",".join(parts) + "]"


def _accepted_from_tree_stats(stats) -> list[int]:
    """Accepted draft tokens per target forward from tree decoding's stats, whose ``accepted_per_step`` counts
    the tokens each forward committed (accepted draft tokens + the bonus token; the prefill commits one)."""
    return [max(int(n) - 1, 0) for n in stats.accepted_per_step]


SELF_TIMED = ("tree", "same_forward", "oracle")  # methods whose stats give their own forwards and times (no hooks)


class TurnRunner:
    """Runs one method on b prompts and returns a TurnRecord per row. ``generate``-based methods run under hooks
    that time the target and the draft and see where each target forward starts; the methods that count and time
    their own steps (``SELF_TIMED``) run on models without hooks, since a hooked output head or layer would turn
    their fast paths off (the packed head copies only a hook-free ``nn.Linear``)."""

    def __init__(self, ctx: BenchContext, device: torch.device):
        self.ctx = ctx
        self.device = device
        self.memory = PeakMemory(device)

    def _hooks(self) -> tuple[ForwardTimer, ForwardTimer, ForwardStarts]:
        from ..eagle3_assistant import decoder_layers

        target = self.ctx.target
        decoder = target.get_decoder() if hasattr(target, "get_decoder") else target.model
        verify_timer = ForwardTimer([target, decoder, target.get_output_embeddings()], self.device)
        draft_timer = ForwardTimer([m for m in (self.ctx.draft, self.ctx.assistant) if m is not None], self.device)
        return verify_timer, draft_timer, ForwardStarts(decoder_layers(target)[0])

    def run(self, method: Method, input_ids, attention_mask, gc, metas: list[dict], batch: int = 1) -> list[TurnRecord]:
        """One method on b left-padded prompts (b = len(metas)): one record per row, labelled with the run's
        ``batch`` size (a suite's last batch may hold fewer prompts). A batch's time, forwards and acceptance
        histogram go to its rows as shares (time / b each; the counts on the first row)."""
        b, prompt_len = input_ids.shape
        hooks = None if method.kind in SELF_TIMED else self._hooks()
        try:
            self.memory.reset()
            sync(self.device)
            t0 = time.perf_counter()
            with torch.inference_mode(), attention_kernels(self.device):  # every method on the same attention kernels
                sequences, stats = method.run(input_ids, attention_mask, gc)
            sync(self.device)
            elapsed = time.perf_counter() - t0
        finally:
            for hook in hooks or ():
                hook.close()
        rows_new = [_strip_padding(sequences[i, prompt_len:].tolist(), gc.pad_token_id, gc.eos_token_id) for i in range(b)]

        if method.kind in TREE_KINDS:
            accepted = _accepted_from_tree_stats(stats)
            forwards, draft_t, verify_t = stats.target_forwards, stats.draft_time_s, stats.verify_time_s
            if not method.tree_params:  # record the shape it chose by default
                tree = stats.tree
                method.tree_params = {
                    "depth": tree.get("depth"),
                    "tree_top_k": tree.get("top_k"),
                    "total_tokens": tree.get("total_tokens"),
                    "lookup_tokens": tree.get("lookup_tokens"),
                    "min_node_prob": tree.get("min_node_prob"),
                    "grow_min_prob": tree.get("grow_min_prob"),
                    "adaptive": tree.get("adaptive"),
                    "draft_sampling": tree.get("draft_sampling"),
                }
        elif method.kind == "same_forward":  # one token per forward, no draft
            forwards, draft_t, verify_t = stats.target_forwards, 0.0, stats.verify_time_s
            accepted = [0] * forwards
        else:  # generate with or without an assistant: from where each target forward started
            verify_timer, draft_timer, starts = hooks
            forwards, draft_t, verify_t = len(starts.starts), draft_timer.total, verify_timer.total
            if b == 1:
                accepted = starts.accepted_per_step(prompt_len, prompt_len + len(rows_new[0]))
            else:  # only plain decoding runs batched here: one token per row and forward
                accepted = [0] * forwards
        peak = round(self.memory.peak_mb(), 1)
        records = []
        for i, meta in enumerate(metas):
            first = i == 0
            prompt = input_ids[i][attention_mask[i].bool()].tolist()
            records.append(
                TurnRecord(
                    prompt_tokens=len(prompt),
                    new_tokens=len(rows_new[i]),
                    time_s=elapsed / b,
                    draft_time_s=float(draft_t) / b,
                    verify_time_s=float(verify_t) / b,
                    target_forwards=int(forwards) if first else 0,
                    accept_hist=(histogram(accepted) if first else []) if accepted is not None else None,
                    peak_memory_mb=peak,
                    batch=batch,
                    tree=dict(stats.tree) if method.kind in TREE_KINDS else None,
                    tree_steps=dict(stats.tree_steps) if first and method.kind in TREE_KINDS and stats.tree_steps else None,
                    output_ids=rows_new[i],
                    prompt_ids=prompt,
                    mode=meta["mode"],
                    method=method.name,
                    suite=meta["suite"],
                    question_id=meta["question_id"],
                    category=meta["category"],
                    turn=meta["turn"],
                )
            )
        return records


def _strip_padding(ids: list[int], pad_id, eos_id) -> list[int]:
    """Drop padding after an end-of-sequence token (batch-1 outputs normally have none)."""
    eos = set(eos_id if isinstance(eos_id, (list, tuple)) else [eos_id]) - {None}
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


# ----------------------------------------------------------------------------------------- prompts
# a base model's prompts (a tokenizer without a chat template): <bos>, each user turn and a newline, the answers as
# they are; recipes/gemma-3-270m.yaml's `target.chat_template` renders its training data the same way
PROMPT_ONLY_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'user' %}{{ '\\n' }}{% endif %}{% endfor %}"
)


def build_prompt(tokenizer, turns: list[str], answers: list[str]) -> torch.Tensor:
    """Token ids (1, L) of a conversation: user turns with the assistant's earlier answers between them, through
    the tokenizer's chat template; without one (a base model) through ``PROMPT_ONLY_TEMPLATE``."""
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    else:  # a base model: prompt only
        text = tokenizer.apply_chat_template(messages, chat_template=PROMPT_ONLY_TEMPLATE, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    return ids


def generation_config_for(target, mode: Mode, max_new_tokens: int, tokenizer, ignore_eos: bool = False):
    """``ignore_eos``: no token stops a row (an empty list, since ``generate`` fills a ``None`` from the model)."""
    gc = copy.deepcopy(target.generation_config)
    gc.max_new_tokens = max_new_tokens
    gc.max_length = None
    gc.min_new_tokens = None
    gc.do_sample = not mode.greedy
    gc.num_beams = 1
    if mode.greedy:
        gc.temperature, gc.top_p, gc.top_k = 1.0, 1.0, 50
    else:
        gc.temperature, gc.top_p, gc.top_k = mode.temperature, mode.top_p, (mode.top_k or None)
    gc.repetition_penalty = None
    if gc.pad_token_id is None:
        gc.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if gc.eos_token_id is None:
        gc.eos_token_id = tokenizer.eos_token_id
    if ignore_eos:
        gc.eos_token_id = []
    gc.return_dict_in_generate = False
    return gc


# ----------------------------------------------------------------------------------------- the run
def _check_finite(**models) -> None:
    """Refuse a model whose weights hold NaN or Inf (made so after loading, or overflowed in a cast): every method
    would emit garbage alike, and the lossless check would compare garbage or score NaN gaps."""
    for what, model in models.items():
        bad = non_finite_tensors(model) if model is not None else []
        if bad:
            shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
            raise ValueError(
                f"The {what}'s weights are not finite (NaN or Inf in {shown}): its outputs mean nothing and "
                "the lossless check would compare them. Load the model again (in float32 if a cast "
                "overflowed)."
            )


def run_benchmark(
    target,
    tokenizer,
    suites: list[Suite],
    methods: list[str] = ("plain", "lookup", "assisted", "tree"),
    draft=None,
    assistant=None,
    assistant_tokenizer=None,
    modes: list[Mode] | None = None,
    max_new_tokens: int = 256,
    tree_grid: list[dict] | None = None,
    lookup_tokens: int = 10,
    warmup: int = 1,
    seed: int = 0,
    progress: bool = True,
    keep_outputs: bool = False,
    max_turns: int | None = None,
    float32_check: bool = True,
    batch_sizes: list[int] = (1,),
    compare_drafts: dict | None = None,
    ignore_eos: bool = False,
) -> dict:
    """Run every method on every question of every suite (interleaved) and return the results dict that
    ``report.write_report`` renders. ``target``/``draft`` must already sit on their device and dtype.
    ``float32_check``: in bf16/fp16, score every greedy output with a float32 copy of the target (``near_ties``),
    which needs memory for that copy once the runs are done. ``batch_sizes``: also run the questions of each suite in
    left-padded batches of these sizes (the methods that take batches: plain, same_forward, tree); every speed-up
    compares methods at the same batch size. ``compare_drafts``: {name: draft}, more drafts of the same target run
    as tree methods ``tree@name`` beside ``draft``'s, on the same questions in the same run. ``ignore_eos``: every
    row runs ``max_new_tokens`` (a batch's time is its longest row's, so rows that stop at different places, as
    sampled or near-tie rows do, would otherwise give methods different token counts for the same time)."""
    _check_finite(
        target=target, draft=draft, assistant=assistant, **{f"draft {name}": d for name, d in (compare_drafts or {}).items()}
    )
    methods = list(dict.fromkeys(methods))
    if "plain" not in methods:
        methods.insert(0, "plain")  # speed-ups are relative to plain decoding in the same run
    if any(m in DRAFT_METHODS for m in methods) and draft is None:
        raise ValueError(f"Methods {[m for m in methods if m in DRAFT_METHODS]} need a draft (--draft).")
    if "assistant" in methods and assistant is None:
        raise ValueError("Method 'assistant' needs --assistant-model.")
    modes = modes or [Mode()]
    device = next(target.parameters()).device
    dtype = next(target.parameters()).dtype
    if compare_drafts and "tree" not in methods:
        raise ValueError("Drafts to compare run as tree methods: add tree to --methods.")
    ctx = BenchContext(target, tokenizer, draft, assistant, assistant_tokenizer, lookup_tokens, dict(compare_drafts or {}))
    method_objs = build_methods(methods, ctx, tree_grid)
    runner = TurnRunner(ctx, device)
    records: list[TurnRecord] = []
    bar = None
    batch_sizes = sorted(set(batch_sizes))
    if not batch_sizes or batch_sizes[0] < 1:
        raise ValueError(f"batch sizes must be at least 1, got {list(batch_sizes)}")
    pad_id = generation_config_for(target, Mode(), 1, tokenizer).pad_token_id
    for suite in suites:  # a batch of size b must hold b prompts at least once, or its rows say a batch it never ran
        if len(suite.questions) < batch_sizes[-1]:
            raise ValueError(
                f"batch size {batch_sizes[-1]} is larger than suite {suite.name}'s {len(suite.questions)} "
                "question(s): every batch would hold fewer prompts than its label says. Lower --batch-size "
                "or raise --num-questions."
            )
    plan = []  # (mode, batch size, methods, groups of questions)
    for mode in modes:
        for size in batch_sizes:
            methods_here = method_objs if size == 1 else [m for m in method_objs if m.batched]
            for suite in suites:
                groups = [suite.questions[i : i + size] for i in range(0, len(suite.questions), size)]
                plan.append((mode, size, methods_here, suite, groups))
    total = sum(len(ms) * len(groups) for _, _, ms, _, groups in plan)
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="bench", unit="run", file=sys.stderr, dynamic_ncols=True)
    try:
        warmed = set()
        for mode, size, methods_here, suite, groups in plan:
            gc = generation_config_for(target, mode, max_new_tokens, tokenizer, ignore_eos)
            if (mode.name, size) not in warmed:
                _warm_up(runner, methods_here, suites, tokenizer, gc, warmup, device, size, pad_id)
                warmed.add((mode.name, size))
            for gi, group in enumerate(groups):
                order = methods_here[gi % len(methods_here) :] + methods_here[: gi % len(methods_here)]
                turns = min(min(len(q.turns) for q in group), max_turns or 10**9)  # max_turns=1: first turns
                for method in order:
                    answers: list[list[str]] = [[] for _ in group]
                    for ti in range(turns):
                        prompts = [build_prompt(tokenizer, q.turns[: ti + 1], answers[j]) for j, q in enumerate(group)]
                        ids, mask = left_pad(prompts, pad_id)
                        if not mode.greedy:
                            torch.manual_seed(seed + 1000 * gi + ti)
                        metas = [
                            dict(suite=suite.name, question_id=q.question_id, category=q.category, turn=ti + 1, mode=mode.name)
                            for q in group
                        ]
                        recs = runner.run(method, ids.to(device), mask.to(device), gc, metas, batch=size)
                        records.extend(recs)
                        for j, rec in enumerate(recs):
                            answers[j].append(tokenizer.decode(rec.output_ids, skip_special_tokens=True).strip())
                    if bar is not None:
                        bar.set_postfix_str(f"{suite.name} {method.name}" + (f" x{size}" if size > 1 else ""), refresh=False)
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()

    near, near_skipped = None, None
    if reduced_precision(dtype) and any(r.mode == "greedy" for r in records):
        if not float32_check:
            near_skipped = "turned off (--no-float32-check)"
        else:
            try:  # float32 scores of every greedy output, by a float32 copy of the target
                near = near_tie_check(records, target, dtype)
            except (torch.cuda.OutOfMemoryError, MemoryError) as e:  # no room for the copy: keep the figures measured
                near_skipped = f"no memory for a float32 copy of the target ({type(e).__name__})"
                print(f"warning: the float32 greedy check was skipped: {near_skipped}", file=sys.stderr)
    results = {
        "format": "eagle3-hub-bench/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(device, dtype),
        "settings": {
            "methods": [m.name for m in method_objs],
            "modes": [m.__dict__ | {"name": m.name} for m in modes],
            "max_new_tokens": max_new_tokens,
            "ignore_eos": ignore_eos,
            "max_turns": max_turns,
            "lookup_tokens": lookup_tokens if "lookup" in methods else None,
            "tree": [m.tree_params for m in method_objs if m.kind == "tree"] or None,
            "warmup": warmup,
            "seed": seed,
            "batch_sizes": batch_sizes,
            "memory_measure": runner.memory.kind,
            "suites": [{"name": s.name, "source": s.source, "questions": len(s)} for s in suites],
        },
        "results": summarize(records),
        "lossless": lossless_check(records, tokenizer, near_ties=near),
        "float32_check_skipped": near_skipped,
        "records": [r.to_json(with_outputs=keep_outputs) for r in records],
    }
    if tree_grid and len(tree_grid) > 1:
        results["sweep"] = sweep_summary(results["results"], method_objs)
    return results


def left_pad(prompts: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts (1, L_i) -> (ids, attention mask) (b, max L_i), left-padded with ``pad_id``."""
    width = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - p.shape[1] :] = p[0]
        mask[i, width - p.shape[1] :] = 1
    return ids, mask


def _warm_up(
    runner: TurnRunner,
    methods: list[Method],
    suites: list[Suite],
    tokenizer,
    gc,
    warmup: int,
    device,
    size: int = 1,
    pad_id: int = 0,
):
    if warmup <= 0 or not suites or not suites[0].questions:
        return
    group = suites[0].questions[:size]
    ids, mask = left_pad([build_prompt(tokenizer, q.turns[:1], []) for q in group], pad_id)
    gc = copy.deepcopy(gc)
    gc.max_new_tokens = min(gc.max_new_tokens, 32)
    metas = [dict(suite="warmup", question_id=q.question_id, category=q.category, turn=1, mode="warmup") for q in group]
    for _ in range(warmup):
        for method in methods:
            runner.run(method, ids.to(device), mask.to(device), gc, metas)
