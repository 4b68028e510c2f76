"""The recipe's schema: every section and key with its type, range, default and meaning, declared once (pydantic v2).

Pydantic rather than dataclasses: ranges, unions, nested sections, strict types and the location of each bad value come
with it, where dataclasses would need the per-key checks this replaces. Values are checked, never converted: a run
reads the recipe as written (``recipe.load_recipe``), so its hashes (run identity, data caches) stay as they were.
Imports no torch: ``eagle3-hub train --show-recipe-schema`` and the docs' tables are written from it.
"""

from __future__ import annotations

import difflib
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from ..extras import missing_extra

try:
    from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
    from pydantic.fields import FieldInfo
    from pydantic_core import ErrorDetails
except ModuleNotFoundError as e:
    raise missing_extra("train", e) from None


class Says:
    """What a value of a type must be, in words (the ``must be ...`` of an error, the type column of the docs)."""

    def __init__(self, text: str):
        self.text = text


PositiveInt = Annotated[int, Field(ge=1), Says("a positive integer")]
Count = Annotated[int, Field(ge=0), Says("an integer >= 0")]
PositiveNumber = Annotated[float, Field(gt=0), Says("a positive number")]
NonNegative = Annotated[float, Field(ge=0), Says("a non-negative number")]
Texts = Annotated[list[str], Says("a list of strings")]
Dtype = Literal["auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"]  # devices.resolve_dtype's names
LOSSES = ("kl", "lk", "lk_log", "lk_hybrid")  # training/losses.py
RegenerateWith = Literal["auto", "tree", "generate", "same_forward"]  # training/generation.py's decoders


class Section(BaseModel):
    """One rule for every section: strict types (``true`` is no number, ``2.5`` no integer), finite numbers only (no
    ``.inf`` or ``.nan`` anywhere), and no key the schema does not know."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")


def loss_weights(spec) -> dict[str, float]:
    """``train.loss`` -> {name: weight}: a loss name, or a mapping of names to non-negative weights, not all zero."""
    example = "e.g. `loss: lk_log` or `loss: {kl: 0.5, lk_log: 0.5}`"
    weights = {spec: 1.0} if isinstance(spec, str) else spec
    if not isinstance(weights, dict) or not weights:
        raise ValueError(f"must name a loss ({', '.join(LOSSES)}) or weigh several ({example}), got {spec!r}")
    unknown = [name for name in weights if name not in LOSSES]
    if unknown:
        raise ValueError(f"unknown loss {unknown[0]!r}; choose from {', '.join(LOSSES)} ({example})")
    if any(
        isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0 for w in weights.values()
    ) or not sum(weights.values()):
        raise ValueError(f"weights must be non-negative numbers, not all zero ({example}), got {spec!r}")
    return {name: float(w) for name, w in weights.items()}


def rule_broken(name: str, error: ValueError) -> str:
    """``train.loss: unknown loss 'mse'...`` or ``train.loss must name a loss...``: a rule's message about a key."""
    text = str(error)
    if text.startswith(name.rpartition(".")[2] + " "):  # the rule names its key already
        name = name.rpartition(".")[0]
    return f"{name}{' ' if text.startswith('must ') else ': '}{text}" if name else text


def _text_suffixes(suffixes):
    """A text source's ``suffixes``: endings with their dot, of text files (records are read by their own suffix)."""
    endings = [suffixes] if isinstance(suffixes, str) else suffixes
    if not endings or any(not x.startswith(".") for x in endings):
        raise ValueError(
            f"suffixes must list the endings of the files read as documents, each with its dot (e.g. [.py, .c]), got {suffixes!r}"
        )
    if set(endings) & set(RECORD_SUFFIXES):
        raise ValueError("suffixes name text files; .json, .jsonl and .parquet files are read as records (their `field`)")
    return suffixes


def _loss(spec):
    loss_weights(spec)
    return spec


class Target(Section):
    name: str | None = Field(
        None,
        description="Hub repo id or local folder (`AutoModelForCausalLM`), a `.gguf` path, a PEFT adapter folder or repo (its base is loaded and the adapter merged), or `null` for the embedded SmolLM2-135M-Instruct",
    )
    gguf_file: str | None = Field(None, description="the GGUF file inside a Hub repo or folder given by `name`")
    adapter: str | None = Field(None, description="a PEFT adapter merged into `name` (a fine-tuned target)")
    dtype: Dtype = Field(
        "bfloat16",
        description="the target's weights. On CPUs without bf16 units (AVX2) use `float32`: bf16 matmuls are ~4x slower there",
    )
    chat_template: str | None = Field(
        None,
        description="a Jinja chat template for a tokenizer that has none (a base model): samples are rendered through it and the loss covers what follows the user turn. `recipes/gemma-3-270m.yaml` uses a plain one: `<bos>`, the prompt, a newline, the continuation (the bench's prompts for a base model)",
    )


class Draft(Section):
    # any Eagle3Config parameter the target does not fix is a key of this section too (recipe.draft_config_keys);
    # Eagle3Config checks those values
    model_config = ConfigDict(extra="allow")

    draft_vocab_size: PositiveInt | None = Field(
        8192,
        description="size of the draft's output vocabulary: the most frequent target tokens among the loss (assistant) tokens of the training split, EOS always included; `null` = the whole target vocabulary. `vocab.json` and `training_metrics.json` report the share of loss tokens it covers, and the coverage of other sizes (`coverage_by_size`) to help choose",
    )
    aux_layer_ids: Annotated[list[int], Field(min_length=3, max_length=3), Says("a list of three layer indices")] | None = Field(
        None,
        description="the three target layers whose outputs the draft reads, 0-based layer outputs (= `output_hidden_states[i + 1]`); default `[1, L//2 - 1, L - 4]` (the inputs of layers `2, L//2, L-3`, as the reference) or first/middle/last for targets under 8 layers",
    )
    intermediate_size: PositiveInt | None = Field(None, description="the draft MLP width (default: the target's)")
    init_from: str | None = Field(
        None,
        description="an existing draft (folder or Hub id, any layout `Eagle3DraftModel.from_pretrained` reads) to continue from; its vocabulary mapping is kept unless `reselect_vocab`. Required by `lora.enabled`",
    )
    reselect_vocab: bool = Field(
        False,
        description="with `init_from`: choose the draft vocabulary anew from this run's data (`draft_vocab_size` tokens, or the continued draft's size when `null`; its tokens win ties of equal counts) instead of keeping the continued draft's. The `lm_head` rows of tokens it keeps carry over unchanged; a new token's row is the target's output row mapped into the draft's output space by the least-squares linear map that carries the target's rows of the shared tokens onto the draft's. `training_metrics.json` reports both coverages and the rows carried over / new / dropped. Not with `lora.enabled` (the adapters are saved for the draft's old head)",
    )
    head_from_target: bool = Field(
        False,
        description="start the draft's `lm_head` from the target's output rows of the draft vocabulary (the target's final-norm gain folded in, so `lm_head(norm(h))` = the target's logits of those tokens) instead of random. With `layer_from_target` a new draft is ahead of random weights at every step (docs/training.md, **Training choices at equal CPU time**); off by default, as `layer_from_target` does not fit every architecture",
    )
    layer_from_target: int | None = Field(
        None,
        description="start the draft's decoder layer from this target layer (0-based, `-1` = the last) instead of random: its attention, MLP and norm gains, each half of q/k/v (embedding side, feature side) at half the target's weight, so equal inputs on both sides give the target layer's output; and `fc` passing the last aux feature through. Needs a Llama-shaped layer (no q/k norms, no extra feed-forward norms) as wide as the draft. Pair it with `head_from_target`",
    )

    @model_validator(mode="after")
    def _from_target_needs_a_new_draft(self):
        if self.init_from and self.layer_from_target is not None:
            raise ValueError("layer_from_target initialises a new draft: remove it, or remove init_from")
        return self


RECORD_SUFFIXES = (".json", ".jsonl", ".parquet")  # local files read as records, whatever a source's kind
TEXT_KEYS = ("opening_chars", "max_chars", "field", "suffixes")  # the keys of a `kind: text` source only


class Source(Section):
    """A data source given as a mapping; its other keys go to ``datasets.load_dataset`` (training/sources.py)."""

    model_config = ConfigDict(extra="allow")

    path: str = Field(
        description="a preset name, a Hub dataset id, or a local `.json`/`.jsonl`/`.parquet` file or folder (with `kind: text`, also `.txt`/`.md` files)"
    )
    kind: Literal["chat", "text"] = Field(
        "chat",
        description="`chat`: conversations or prompts; `text`: documents, each cut into pieces whose opening is the prompt and whose rest is the answer (**Natural text** below)",
    )
    max_samples: PositiveInt | None = Field(None, description="a seeded random subset of this many samples")
    regenerate: bool | None = Field(
        None,
        description="`false`: keep this source's answers even when `data.regenerate` is on (data this target has answered already, such as an earlier run's `regen-*.jsonl`); `true`: the target answers it even when it is off (or continues the openings of a text source); `null` = `data.regenerate` (text sources: `false`)",
    )
    eval: bool = Field(
        True, description="`false` keeps this source's samples out of the held-out split (data an earlier stage trained on)"
    )
    # A document's sample opens with about this many characters (a sentence or two, ~50 tokens) as the user turn: the
    # rest carries the loss, and an opening gives the draft a start to continue from, as a base model's prompt does.
    opening_chars: PositiveInt = Field(
        200,
        description="`kind: text`: the most characters of a piece's opening (at most half the piece, ending at a line break or a space)",
    )
    # ~500 tokens of English, within data.max_length's default of 1024
    max_chars: PositiveInt = Field(
        2000,
        description="`kind: text`: documents longer than this are cut into pieces at line breaks, each a sample; set it near 4 x `data.max_length` so little is truncated",
    )
    field: Annotated[str, Says("the name of the records' text field")] = Field(
        "text", description="`kind: text`: the field of `.json`/`.jsonl`/`.parquet` records that holds the document"
    )
    suffixes: Annotated[
        str | list[str],
        AfterValidator(_text_suffixes),
        Says("the endings of the files read as documents, each with its dot (e.g. [.py, .c])"),
    ] = Field(
        [".txt", ".md"],
        description="`kind: text`: the endings of the files of a folder read as documents, e.g. `[.py, .js, .c]` for code",
    )

    @model_validator(mode="after")
    def _text_keys_need_kind_text(self):
        given = [k for k in TEXT_KEYS if k in self.model_fields_set]
        if self.kind == "chat" and given:
            raise ValueError(f"{', '.join(given)} belong to documents: add `kind: text`")
        return self


SourceEntry = Annotated[str | Source, Says("a path, Hub id or preset, or a mapping {path, ...}")]


class AnswerSetting(Section):
    """One setting of ``data.answer_sampling``: greedy (``temperature: 0``) or sampled, for a ``share`` of prompts."""

    temperature: NonNegative = Field(0.0, description="sampling temperature (0 = greedy)")
    top_p: Annotated[float, Field(gt=0, le=1), Says("a number in (0, 1]")] = Field(
        1.0, description="nucleus sampling: the smallest set of tokens whose probability reaches this (sampled settings only)"
    )
    share: PositiveNumber = Field(1.0, description="how many prompts get this setting, relative to the other settings' shares")


class Data(Section):
    sources: Annotated[list[SourceEntry], Says("a list of sources (paths, Hub ids, presets, or mappings {path, ...})")] = Field(
        [],
        description="the data: each source a preset name, a Hub dataset id, a local `.json`/`.jsonl`/`.parquet` file or folder, or a mapping `{path, ...}` with the keys of a source (below: `max_samples`, `regenerate`, `eval`, `kind: text` for documents, ...; its other keys, such as `split`, `data_files` and `name`, go to `datasets.load_dataset`)",
    )
    synthesize: Count = Field(
        0, description="number of prompts the target writes itself (Magpie style, below); works with no `sources` at all"
    )
    synthesize_seed: int | None = Field(
        None,
        description="seed of the synthesised prompts (default `data.seed`); another seed gives other prompts, e.g. to add new ones to data synthesised before",
    )
    synthesize_openers: Annotated[list[str], Says('a list of strings (e.g. ["Write", "Explain", ""])')] = Field(
        [],
        description='words that start the synthesised prompts, in turn (`["Write", "Solve", "Imagine you are", ""]`; `""` leaves the start to the target): steer a small target, which mostly asks for advice when left alone, to other kinds of request',
    )
    regenerate: bool = Field(
        True,
        description="answer every prompt with the target (greedy unless `temperature` > 0) instead of training on the dataset's answers",
    )
    regenerate_with: RegenerateWith = Field(
        "auto",
        description="which decoder writes the target's answers and synthesised prompts: `generate` (transformers' plain `generate`), `tree` (our lossless tree decoding with `regenerate_draft`; float32 greedy writes plain greedy's tokens, bf16 may part at near-ties; sampled synthesis through it keeps the distribution, not the exact prompts of a seed), `same_forward` (plain greedy decoding through tree decoding's verifier: its lean forward and packed head, one token per step; plain greedy's tokens in float32, faster than `generate` on CPUs at batch sizes of 32 and more; sampled calls stay on `generate`), `auto` (greedy answers: `same_forward` on a CPU, 1.40x `generate` at batch 32 (below); elsewhere tree decoding where a draft exists for the target, `generate` otherwise). `work_dir/data/generation_report.json` (and `data_report.json`) records the decoder, tokens/s and tokens per CPU-minute of every call",
    )
    regenerate_draft: str | None = Field(
        None,
        description="the draft for `regenerate_with: tree|auto` (folder or Hub id); null = the reference draft shipped for the target, if any",
    )
    max_new_tokens: PositiveInt = Field(384, description="length limit of regenerated answers")
    temperature: NonNegative = Field(0.0, description="sampling temperature of regenerated answers (0 = greedy)")
    answer_sampling: list[AnswerSetting] = Field(
        [],
        description="answers at several settings: a list of `{temperature, top_p, share}` (`{temperature: 0}` = greedy); each prompt is answered at one of them, drawn by its text and the data seed, with `share` weighing how many get it. `[]` = every answer at `temperature`",
    )
    answers_per_prompt: PositiveInt = Field(
        1,
        description="sampled answers the target writes to each prompt it answers (each its own sample; two the same are kept once): more training samples from the same prompts. Needs every answer sampled (`temperature` > 0, no greedy `answer_sampling` entry). A held-out prompt's other answers are left out of training",
    )
    max_repeat_share: Annotated[
        Annotated[float, Field(gt=0, le=1)] | None,
        Says("a number in (0, 1] or null (e.g. 0.2: answers whose 8-grams repeat more than that are cut where the loop begins)"),
    ] = Field(
        None,
        description="cut loops out of the answers: an answer whose share of repeated 8-grams (the bench's `loop_share`) is above this number in (0, 1] is cut where its loop begins (below); `null` keeps every answer whole",
    )
    gen_batch_size: PositiveInt = Field(16, description="prompts per batched `generate` call when the target answers")
    synthesize_batch_size: PositiveInt = Field(
        16,
        description="prompts the target writes per `generate` call. The batch shapes the random draws, so the same prompts need the same value. Larger batches are not always faster: a batch runs until its longest prompt ends",
    )
    max_turns: PositiveInt = Field(
        1, description="user turns answered per conversation when regenerating (later turns are dropped)"
    )
    strip_patterns: Texts = Field(
        [], description="regexes removed from every message (e.g. GSM8K's `<<48/2=24>>` calculator notes)"
    )
    max_length: Annotated[int, Field(ge=4), Says("an integer >= 4")] = Field(
        1024, description="tokens per sample; longer samples are truncated"
    )
    eval_samples: Count = Field(
        64,
        description="held-out samples (at most a tenth of the data, at least one), drawn from the samples of sources without `eval: false`",
    )
    num_proc: PositiveInt | None = Field(None, description="processes for `datasets.map` (tokenisation)")
    seed: int | None = Field(
        None,
        description="seed of the data: its shuffle, the held-out split and (unless `synthesize_seed`) the synthesised prompts; default `train.seed`. Set it to keep the same data and held-out samples across runs that differ only in `train.seed`",
    )

    @model_validator(mode="after")
    def _more_answers_need_sampling(self):
        problem = greedy_repeats(self.answers_per_prompt, self.temperature, [st.temperature for st in self.answer_sampling])
        if problem:
            raise ValueError(problem)
        return self


# keys added after recipes were first keyed (a run's id, its tokenised data's key): left out of both while at their
# default, so that a run or data written before the key existed keeps its key, and resumes
LATER_KEYS: dict[str, dict[str, Any]] = {"data": {"answers_per_prompt": 1}}


def without_later_defaults(recipe: dict) -> dict:
    """``recipe`` (or the part of it a key is made of) without the ``LATER_KEYS`` that hold their default."""
    out = dict(recipe)
    for section, keys in LATER_KEYS.items():
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if not (k in keys and v == keys[k])}
    return out


def greedy_repeats(answers_per_prompt: int, temperature: float, setting_temperatures: list[float]) -> str | None:
    """Why ``answers_per_prompt`` cannot hold with these answer settings (greedy answers to one prompt are all the
    same), or None."""
    if answers_per_prompt == 1:
        return None
    greedy = 0 in setting_temperatures if setting_temperatures else temperature == 0
    if not greedy:
        return None
    fix = (
        "leave only entries with temperature > 0 in data.answer_sampling"
        if setting_temperatures
        else "set data.temperature above 0"
    )
    return (
        f"answers_per_prompt: {answers_per_prompt} asks for several answers to each prompt, but greedy answers to "
        f"one prompt are all the same: {fix}, or set answers_per_prompt to 1"
    )


class Features(Section):
    mode: Literal["online", "offline"] = Field(
        "online",
        description="`online`: a target forward inside each training step. `offline`: one pass first writes the target features to disk, training reads them",
    )
    cache_dir: str | None = Field(None, description="where offline features go (default `work_dir/features`)")
    reuse_from: Annotated[list[str], Says("a list of earlier runs' work_dirs")] = Field(
        [],
        description="earlier runs' `work_dir`s (offline features of the same target and layers): a sample whose tokens are identical to one of theirs gets its features copied, not computed; their target generations (`data/*.jsonl` caches, named by the hash of prompts, target and sampling settings) are copied too, not generated again. For a later stage that keeps the earlier stages' data",
    )


class Train(Section):
    ttt_steps: PositiveInt = Field(7, description="training-time-test unroll length (below)")
    eval_ttt_steps: PositiveInt | None = Field(
        None,
        description="the unroll of held-out evaluations (null: `ttt_steps`): drafts trained with different unrolls are compared at the same one",
    )
    step_weight: PositiveNumber = Field(0.8, description="step k's loss is weighted `step_weight ** k`")
    loss: Annotated[
        str | dict[str, float],
        AfterValidator(_loss),
        Says("an objective name (kl, lk, lk_log, lk_hybrid) or a mapping of them to weights"),
    ] = Field(
        "kl",
        description="the objective of each draft step: `kl`, `lk`, `lk_log`, `lk_hybrid`, or a weighted mix such as `{kl: 0.5, lk_log: 0.5}` (**Objectives** below)",
    )
    lk_eta: NonNegative = Field(3.0, description="`lk_hybrid`: the KL weight is `exp(-lk_eta * mean acceptance)`")
    epochs: PositiveInt = Field(1, description="passes over the training split (when `max_steps` is null)")
    max_steps: PositiveInt | None = Field(None, description="optimizer steps; overrides `epochs`")
    batch_size: PositiveInt = Field(4, description="samples per process per micro-step")
    group_by_length: bool = Field(
        True,
        description="batches of samples of similar length (groups of 32 batches sorted by length, batches in random order), as transformers' `group_by_length`: less padding, so fewer wasted tokens per step. `false`: plain random batches",
    )
    # several samples a row, each attended, positioned and scored as if alone (training/batching.py)
    packing: bool = Field(
        False,
        description="several samples a row (**Packing** below): each micro-step trains `batch_size` rows of up to `pack_tokens` tokens; replaces `group_by_length`. The held-out evaluation stays one sample a row",
    )
    pack_tokens: PositiveInt | None = Field(
        None,
        description="tokens per packed row (a longer sample gets a row of its own); `null`: the longest training sample's length (at most `data.max_length`)",
    )
    grad_accum: PositiveInt = Field(1, description="micro-steps per optimizer step")
    lr: PositiveNumber = Field(5e-4, description="peak learning rate (AdamW)")
    weight_decay: NonNegative = Field(0.0, description="AdamW weight decay")
    betas: Annotated[
        list[Annotated[float, Field(ge=0, lt=1)]],
        Field(min_length=2, max_length=2),
        Says("a list of two numbers in [0, 1), like [0.9, 0.95]"),
    ] = Field([0.9, 0.95], description="AdamW betas")
    warmup_steps: Count = Field(50, description="linear warm-up, then cosine decay to 10% of `lr` at the last step")
    grad_clip: PositiveNumber = Field(0.5, description="gradient norm clipping")
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = Field(
        "auto",
        description="`auto`: bf16 autocast on GPUs that support it (fp16 on older ones) and on CPUs with bf16 units (AVX512-BF16 or AMX), none on other CPUs (bf16 runs ~4x slower there); or `no`, `bf16`, `fp16`. The draft's weights stay fp32",
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute the draft layer in the backward pass (same gradients, less memory)"
    )
    save_every: PositiveInt = Field(100, description="checkpoint every N steps (and at the end)")
    eval_every: PositiveInt = Field(100, description="evaluate the held-out split every N steps (and at the end)")
    eval_steps: list[PositiveInt] = Field(
        [],
        description="also evaluate at these steps, e.g. `[10, 20, 40, 80, 160]`: a learning curve on a log axis of tokens (`python -m eagle3_hub.commands.learning_curve`)",
    )
    log_every: PositiveInt = Field(10, description="TensorBoard and progress bar every N steps")
    keep_checkpoints: PositiveInt = Field(2, description="checkpoints kept")
    seed: int = Field(
        0, description="the draft's initialisation and the order of the batches; also the data's seed unless `data.seed` is set"
    )
    num_threads: PositiveInt | None = Field(None, description="torch CPU threads (set 1 when other work shares the cores)")


class Lora(Section):
    enabled: bool = Field(
        False, description="train LoRA adapters (peft) on the draft of `draft.init_from` instead of all weights"
    )
    r: PositiveInt = Field(16, description="LoRA rank: the inner width of each adapter")
    alpha: PositiveNumber = Field(32, description="LoRA scaling: an adapter's output is multiplied by `alpha / r`")
    dropout: Annotated[float, Field(ge=0, lt=1), Says("a number in [0, 1)")] = Field(
        0.0, description="dropout on the adapters' input while training"
    )
    target_modules: Texts = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="draft modules that get adapters (add `fc` or `lm_head` if needed)",
    )


class Recipe(Section):
    """A whole recipe: the sections, then the top-level keys."""

    target: Target = Field(Target(), description="the model the draft is trained for")
    draft: Draft = Field(Draft(), description="the draft trained (a new one, or one continued)")
    data: Data = Field(Data(), description="the training conversations: sources, the target's answers, cleaning")
    features: Features = Field(Features(), description="the target's hidden states the draft reads")
    train: Train = Field(Train(), description="the optimisation")
    lora: Lora = Field(Lora(), description="LoRA adapters on a continued draft")
    work_dir: str = Field("runs/draft", description="data, vocabulary, features, checkpoints, logs")
    output_dir: str | None = Field(None, description="the draft folder (default `work_dir/draft`)")
    push_to_hub: str | None = Field(
        None,
        description="upload the draft folder to this repo id after training (`eagle3-hub push`); a failed upload keeps the folder and prints the command that retries it",
    )
    private: bool = Field(False, description="create the repo private")
    stages: Annotated[list[str | dict[str, Any]], Says("a list of changes to the stage before (mappings) or recipe files")] = (
        Field(
            [],
            description="later stages trained after this one in the same command, each a mapping of changes (or a recipe file) continuing the draft of the one before (**Stages** above)",
        )
    )


def _default(info: FieldInfo):
    default = info.get_default(call_default_factory=True)
    return default.model_dump() if isinstance(default, BaseModel) else default


def defaults(model: type[BaseModel] = Recipe) -> dict:
    """The schema's defaults as a nested dict: a recipe with nothing set."""
    return {name: _default(info) for name, info in model.model_fields.items()}


def sections() -> dict[str, type[BaseModel]]:
    """The recipe's sections (``target``, ``draft``, ...), each with its model."""
    return {name: info.annotation for name, info in Recipe.model_fields.items() if _is_model(info.annotation)}


def _is_model(tp) -> typing.TypeGuard[type[BaseModel]]:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def field_info(dotted: str) -> FieldInfo | None:
    """The field of the recipe key ``train.lr`` (None for a key the schema does not declare)."""
    model: Any = Recipe
    info = None
    for part in dotted.split("."):
        if not _is_model(model) or part not in model.model_fields:
            return None
        info = model.model_fields[part]
        model = info.annotation
    return info


def expected(tp, metadata: list | tuple = ()) -> str:
    """What a value of type ``tp`` must be, in words (``a positive integer or null``)."""
    for m in metadata:
        if isinstance(m, Says):
            return m.text
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return expected(args[0], tp.__metadata__)
    if origin in (Union, types.UnionType):
        kinds = [expected(a) for a in args if a is not type(None)]
        return " or ".join(kinds) + (" or null" if type(None) in args else "")
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin is list:
        item = args[0] if args else None
        return f"a list of mappings of {', '.join(item.model_fields)}" if _is_model(item) else "a list"
    if origin is dict:
        return "a mapping"
    if _is_model(tp):
        return f"a mapping of {', '.join(tp.model_fields)}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def field_expected(info: FieldInfo) -> str:
    return expected(info.annotation, info.metadata)


def _shown(value) -> str:
    return json.dumps(value, default=str)


def error_line(
    error: Mapping[str, Any], prefix: str = "", flags: bool = False, given=None, root: type[BaseModel] = Recipe
) -> str:
    """One pydantic error -> ``<prefix>train.lr must be a positive number (default 0.0005), got true``: the key (with
    the index of a list entry whose own key is bad), what it must be, its default, and the value ``given`` there
    (``flags``: as the ``--key=value`` flag it came from)."""
    name, pending, info, inside, value, where = "", "", None, [root], given, given
    for part in error["loc"]:
        if isinstance(part, int):  # an entry of a list: its index shows only before a key of that entry
            pending += f"[{part}]"
            where = where[part] if isinstance(where, list) and 0 <= part < len(where) else None
            continue
        model = next((t for t in inside if _is_model(t) and part in t.model_fields), None)
        if model is not None:
            info, name, pending = model.model_fields[part], f"{name}{pending}.{part}" if name else part, ""
            where = value = where.get(part) if isinstance(where, dict) else None
            inside = _types(info.annotation)
        elif error["type"] == "extra_forbidden" and part == error["loc"][-1]:
            known = [k for t in inside if _is_model(t) for k in t.model_fields]
            near = difflib.get_close_matches(part, known, 1, cutoff=0.5)
            hint = f" (did you mean `{near[0]}`?)" if near else ""
            return f"{prefix}{name}{pending} has no key `{part}`{hint}: its keys are {', '.join(known)}"
        else:  # a branch of a union (``str``, ``Source``): look inside that one
            inside = [t for t in inside if getattr(t, "__name__", None) == part] or inside
    if error["type"] == "value_error":  # a rule of the schema that says more than a type and a range
        return prefix + rule_broken(name + pending, error["ctx"]["error"])
    if info is None:
        return f"{prefix}{name} {error['msg']}, got {_shown(value)}"
    if error["type"] == "missing":
        return f"{prefix}{name} is missing: give it ({field_expected(info)})"
    default = _default(info)
    example = "" if default is None or isinstance(default, dict) else f" (default {_shown(default)})"
    got = f"--{name}={_shown(value)}" if flags and "[" not in name else _shown(value)
    return f"{prefix}{name} must be {field_expected(info)}{example}, got {got}"


def _types(tp) -> list:
    """``tp`` and the types inside it (an Optional, a union, a list's items), for finding the models of a key."""
    out, todo = [], [tp]
    while todo:
        t = todo.pop()
        out.append(t)
        todo.extend(typing.get_args(t)[:1] if typing.get_origin(t) is Annotated else typing.get_args(t))
    return out


def _first(errors: list[ErrorDetails], depth: int | None = None) -> ErrorDetails:
    """The error of the first bad key (of its first bad list entry), and of the errors of its value (one per branch
    of a union), the one that got furthest."""

    def key(e):
        loc = e["loc"]
        n = depth or (2 if loc[0] in sections() else 1)
        return loc[:n] + tuple(x for x in loc[n : n + 1] if isinstance(x, int))

    first = key(errors[0])
    return max(
        (e for e in errors if key(e) == first), key=lambda e: (e["type"] != "missing", len(e["loc"]), e["type"] == "value_error")
    )


def validate(recipe: dict, prefix: str = "", flags: bool = False) -> None:
    """Refuse, in one line naming the key, the value and what is expected, the first bad value of ``recipe`` (a
    whole recipe, its sections mappings); unknown keys are ``recipe.merge_changes``' to name."""
    try:
        Recipe.model_validate(recipe)
    except ValidationError as e:
        raise ValueError(error_line(_first(e.errors()), prefix, flags, recipe)) from None


def validate_key(dotted: str, value, prefix: str = "") -> None:
    """Refuse a bad value of the one recipe key ``dotted`` (for code that takes a key's value outside a recipe)."""
    info = field_info(dotted)
    assert info is not None, dotted
    try:
        params = (info.annotation, *info.metadata)
        tp: Any = Annotated[params] if info.metadata else info.annotation
        TypeAdapter(tp, config=Section.model_config).validate_python(value)
    except ValidationError as e:
        section, _, key = dotted.rpartition(".")
        errors = [ErrorDetails(**{**x, "loc": (*(section.split(".") if section else ()), key, *x["loc"])}) for x in e.errors()]
        given: Any = value
        for part in reversed([*section.split("."), key] if section else [key]):
            given = {part: given}
        raise ValueError(error_line(_first(errors), prefix, given=given)) from None


def is_switch(dotted: str) -> bool:
    """Whether the recipe key ``dotted`` is true/false (its ``--flag`` may stand alone, meaning true)."""
    info = field_info(dotted)
    return info is not None and info.annotation is bool


def takes_text(dotted: str) -> str:
    """``"text"`` for a key that holds a string, ``"or null"`` for one that holds a string or null, else ``""``."""
    info = field_info(dotted)
    if info is None:
        return ""
    args = (
        typing.get_args(info.annotation) if typing.get_origin(info.annotation) in (Union, types.UnionType) else (info.annotation,)
    )
    kinds = [a for a in args if a is not type(None)]
    text = all(a is str or typing.get_origin(a) is Literal for a in kinds)
    return ("or null" if type(None) in args else "text") if text else ""


def validate_source(spec: dict, prefix: str = "") -> None:
    """Refuse a bad data source given as a mapping (``Source``), in one line that starts with ``prefix``."""
    try:
        Source.model_validate(spec)
    except ValidationError as e:
        errors = e.errors()
        raise ValueError(error_line(_first(errors, depth=1), prefix, given=spec, root=Source)) from None
