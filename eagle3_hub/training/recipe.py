"""Training recipes: a YAML file of nested sections; every key is also a CLI flag (``--train.lr 3e-4``)."""

from __future__ import annotations

import copy
import inspect
import json
import math
import re
from pathlib import Path

import yaml

DEFAULTS: dict = {
    # chat_template: a Jinja template given to the target's tokenizer, for a base model that has none (samples are
    # rendered through it, and the loss mask takes the tokens after what it writes before the answer)
    "target": {"name": None, "gguf_file": None, "adapter": None, "dtype": "bfloat16", "chat_template": None},
    "draft": {
        "draft_vocab_size": 8192,
        "aux_layer_ids": None,
        "intermediate_size": None,
        "init_from": None,
        # with init_from: choose the draft vocabulary anew from this run's data (draft_vocab_size tokens, or the init
        # draft's size when null) instead of keeping the init draft's; rows of tokens it keeps are carried over
        "reselect_vocab": False,
        # start the draft's lm_head from the target's (its draft-vocabulary rows, the target's final-norm scale
        # folded in) instead of random: the draft then only learns to land in the target's output space
        "head_from_target": False,
    },
    "data": {
        # Hub ids, presets (sharegpt, ultrachat) or local json/jsonl/parquet, optionally {path, max_samples}; documents
        # (natural text: .txt/.md files, records with a `text` field) as {path, kind: text}, each an opening and its rest
        "sources": [],
        "synthesize": 0,  # Magpie-style prompts written by the target itself
        "synthesize_seed": None,  # seed of those prompts (default: train.seed); another seed gives other prompts
        "synthesize_openers": [],  # words that start the synthesised prompts, in turn (steer the kinds of request)
        "regenerate": True,  # answer every prompt with the target (a draft must learn the target's distribution)
        # how the target writes answers and synthesised prompts: generate (plain target.generate), tree (lossless tree
        # decoding with regenerate_draft), same_forward, or auto (greedy answers: same_forward on a CPU, elsewhere tree
        # where there is a draft, else generate;
        # sampled prompt synthesis stays on generate so that a seed keeps its prompts). Greedy tree decoding writes
        # plain greedy's tokens (float32) in fewer target forwards; work_dir/data/generation_report.json records
        # which decoder wrote the data and its tokens per second and per CPU-minute
        "regenerate_with": "auto",
        "regenerate_draft": None,  # an EAGLE-3 draft folder or Hub id for the target (default: its reference draft)
        "max_new_tokens": 384,
        "temperature": 0.0,
        # answers at the temperatures users sample: a list of {temperature, top_p, share}; each prompt is answered at
        # one of them, drawn by its text and the data seed ({temperature: 0} for greedy answers); [] = `temperature`
        "answer_sampling": [],
        # answers whose share of repeated 8-grams (token ids, the bench's loop_share) is above this are cut where the
        # loop begins; null keeps every answer whole. Applied when the data is assembled: the caches keep raw answers
        "max_repeat_share": None,
        "gen_batch_size": 16,
        "synthesize_batch_size": 16,  # prompts sampled per call; part of the sampling, so a rerun needs the same
        "max_turns": 1,
        "strip_patterns": [],  # regexes removed from every message (e.g. GSM8K's "<<48/2=24>>" calculator notes)
        "max_length": 1024,
        "eval_samples": 64,
        "num_proc": None,
        # seed of the data's order and held-out split (default: train.seed); runs that differ only in train.seed then
        # share the same data and held-out samples (the A/B harness)
        "seed": None,
    },
    # mode: online | offline (safetensors shards on disk); reuse_from: earlier runs' work_dirs whose offline
    # features of the same samples, and whose target generations (data/*.jsonl caches), are copied instead of
    # computed again (a later training stage)
    "features": {"mode": "online", "cache_dir": None, "reuse_from": []},
    "train": {
        "ttt_steps": 7,
        "step_weight": 0.8,
        # the objective of each draft position: kl (soft cross-entropy against the target), lk (1 - acceptance),
        # lk_log (-log acceptance), lk_hybrid (KL blended into 1 - acceptance as the draft improves), or a weighted
        # mix such as {kl: 0.5, lk_log: 0.5} (training/losses.py)
        "loss": "kl",
        "lk_eta": 3.0,  # lk_hybrid: the KL weight is exp(-lk_eta * mean acceptance)
        "epochs": 1,
        "max_steps": None,
        "batch_size": 4,
        "group_by_length": True,  # batches of similar lengths (less padding); false: plain random batches
        # several samples a row (each attended, positioned and scored as if alone), batch_size rows of at most
        # pack_tokens tokens (null: the longest sample's length); replaces group_by_length
        "packing": False,
        "pack_tokens": None,
        "grad_accum": 1,
        "lr": 5e-4,
        "weight_decay": 0.0,
        "betas": [0.9, 0.95],
        "warmup_steps": 50,
        "grad_clip": 0.5,
        "mixed_precision": "auto",  # auto: bf16 where the device supports it
        "gradient_checkpointing": False,
        "save_every": 100,
        "eval_every": 100,
        "log_every": 10,
        "keep_checkpoints": 2,
        "seed": 0,
        "num_threads": None,
    },
    "lora": {"enabled": False, "r": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]},
    "work_dir": "runs/draft",  # data, features, checkpoints, logs
    "output_dir": None,  # final draft folder (default: <work_dir>/draft)
    "push_to_hub": None,  # repo id
    "private": False,
    # later stages, trained in order after this one, each continuing the draft the one before wrote (its
    # draft.init_from): a draft trained in stages, in one command. A stage is a mapping of changes to the stage before
    # it (its work_dir defaults to <work_dir>-stage<i>; `data.add_sources` appends sources to the earlier ones, which
    # become `eval: false`), or the path of a recipe file (from the directory the command runs in)
    "stages": [],
}
# keys a command-line override sets for the first recipe only, not for its later stages
FIRST_STAGE_ONLY = ("stages", "work_dir", "output_dir")


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _text(v) -> bool:
    return isinstance(v, str)


def _source(v) -> bool:
    return _text(v) or isinstance(v, dict) and v.get("kind", "chat") in ("chat", "text")


# What a recipe value must be where its default does not say it all (a range, or a default of null); every other
# value must be of its default's kind (true/false, a number, a string, a list). Checked when a recipe is read.
VALUE_RULES: dict[str, tuple[str, object]] = {
    **{k: ("a string or null", lambda v: v is None or _text(v)) for k in (
        "target.name", "target.gguf_file", "target.adapter", "target.chat_template", "draft.init_from",
        "data.regenerate_draft", "features.cache_dir", "output_dir", "push_to_hub")},
    **{k: ("a positive integer or null", lambda v: v is None or (_integer(v) and v >= 1)) for k in (
        "draft.draft_vocab_size", "draft.intermediate_size", "data.num_proc", "train.max_steps", "train.num_threads",
        "train.pack_tokens")},
    **{k: ("an integer or null", lambda v: v is None or _integer(v)) for k in ("data.synthesize_seed", "data.seed")},
    **{k: ("a positive integer", lambda v: _integer(v) and v >= 1) for k in (
        "data.max_new_tokens", "data.gen_batch_size", "data.synthesize_batch_size", "data.max_turns", "train.ttt_steps",
        "train.epochs", "train.batch_size", "train.grad_accum", "train.save_every", "train.eval_every",
        "train.log_every", "train.keep_checkpoints", "lora.r")},
    **{k: ("an integer >= 0", lambda v: _integer(v) and v >= 0) for k in (
        "data.synthesize", "data.eval_samples", "train.warmup_steps")},
    **{k: ("a positive number", lambda v: _number(v) and v > 0) for k in (
        "train.lr", "train.step_weight", "train.grad_clip", "lora.alpha")},
    **{k: ("a non-negative number", lambda v: _number(v) and v >= 0) for k in (
        "data.temperature", "train.lk_eta", "train.weight_decay")},
    "data.max_length": ("an integer >= 4", lambda v: _integer(v) and v >= 4),
    "data.max_repeat_share": ("a number in (0, 1] or null (e.g. 0.2: answers whose 8-grams repeat more than that are "
                              "cut where the loop begins)", lambda v: v is None or (_number(v) and 0 < v <= 1)),
    "data.sources": ("a list of sources, each a path, Hub id or preset, or a mapping {path, ...} whose `kind` is "
                     "chat (the default) or text", lambda v: isinstance(v, list) and all(_source(s) for s in v)),
    "lora.dropout": ("a number in [0, 1)", lambda v: _number(v) and 0 <= v < 1),
    "train.betas": ("a list of two numbers in [0, 1), like [0.9, 0.95]",
                    lambda v: isinstance(v, list) and len(v) == 2 and all(_number(b) and 0 <= b < 1 for b in v)),
    "draft.aux_layer_ids": ("a list of three layer indices or null",
                            lambda v: v is None or (isinstance(v, list) and len(v) == 3 and all(_integer(i) for i in v))),
    "train.loss": ("an objective name (kl, lk, lk_log, lk_hybrid) or a mapping of them to weights",
                   lambda v: isinstance(v, (str, dict))),
    "data.synthesize_openers": ('a list of strings (e.g. ["Write", "Explain", ""])',
                                lambda v: isinstance(v, list) and all(_text(o) for o in v)),
    "features.reuse_from": ("a list of earlier runs' work_dirs", lambda v: isinstance(v, list) and all(_text(p) for p in v)),
}
_KINDS = ((bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "a string"), (list, "a list"))


def _value_rule(key: str, default) -> tuple[str, object] | None:
    if key in VALUE_RULES:
        return VALUE_RULES[key]
    for kind, expected in _KINDS:
        if isinstance(default, kind):
            if kind is bool:
                return expected, lambda v: isinstance(v, bool)
            if kind in (int, float):  # an integer default takes integers only; a float one any number
                return expected, (_integer if kind is int else _number)
            return expected, lambda v, kind=kind: isinstance(v, kind)
    return None  # a default of null without a rule: any value


def check_values(values: dict, where: str, flags: bool = False, path: str = "", schema: dict | None = None) -> None:
    """Refuse, in one line naming the key, the value and what is expected, a value in ``values`` (a recipe or a
    part of one) of the wrong type or out of range. ``where`` starts the line (the file); ``flags``: the values
    came from ``--section.key`` flags."""
    schema = DEFAULTS if schema is None else schema
    for key, value in values.items():
        name = f"{path}{key}"
        if key not in schema:  # a draft config key (Eagle3Config checks it) or unknown (_merge names it)
            continue
        default = schema[key]
        if isinstance(default, dict):
            if isinstance(value, dict):
                check_values(value, where, flags, f"{name}.", default)
            continue
        rule = _value_rule(name, default)
        if rule is None or rule[1](value):
            continue
        shown = json.dumps(value, default=str)
        example = "" if default is None else f" (default {json.dumps(default)})"
        raise ValueError(f"{where}{name} must be {rule[0]}{example}, got {f'--{name}={shown}' if flags else shown}")


class RecipeLoader(yaml.SafeLoader):
    """YAML with YAML 1.2 floats and booleans: ``3e-4`` is a number (PyYAML's YAML 1.1 reads it as a string), and
    only true/false are booleans (YAML 1.1 reads ``no``, as in ``mixed_precision: no``, as false)."""


_BOOL = "tag:yaml.org,2002:bool"
RecipeLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
RecipeLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
               r"|[0-9][0-9_]*[eE][-+]?[0-9]+|\.(?:inf|Inf|INF)|[-+]\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)


def _load_yaml(text, where: str = "the recipe"):
    """YAML 1.2-style parsing; a syntax error becomes one ValueError naming ``where``, the line and the fix."""
    try:
        return yaml.load(text, Loader=RecipeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(e.problem or e.context or "").split())
        raise ValueError(f"{where} is not valid YAML{at}: {problem}. Fix that line (`key: value` pairs, nested sections "
                         "indented by two spaces; quote a value that holds ': ' or ' #').") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{where} is not valid YAML: {' '.join(str(e).split())}") from None


# Eagle3Config parameters that describe the target (read from it: the draft shares its embedding and reads its
# features) or that the draft section already names; every other parameter is a `draft:` key of the recipe
# (e.g. `fc_norm: true`) passed to the config of a new draft.
_SET_BY_TRAINING = {"self", "kwargs", "vocab_size", "hidden_size", "target_hidden_size", "eagle_config",
                    "target_num_hidden_layers", "target_model_type", "pad_token_id", "bos_token_id", "eos_token_id",
                    "draft_vocab_size", "intermediate_size"}


def draft_config_keys() -> list[str]:
    """The ``Eagle3Config`` parameters a recipe's ``draft:`` section may set for a new draft."""
    from ..configuration_eagle3 import Eagle3Config

    return [k for k in inspect.signature(Eagle3Config.__init__).parameters if k not in _SET_BY_TRAINING]


def draft_config_overrides(recipe: dict) -> dict:
    """The recipe's ``draft:`` keys that go to the draft's config (those not among ``DEFAULTS["draft"]``)."""
    return {k: v for k, v in recipe["draft"].items() if k not in DEFAULTS["draft"]}


def _merge(base: dict, update: dict, path: str = "", schema: dict | None = None) -> dict:
    schema = DEFAULTS if schema is None else schema
    for key, value in update.items():
        if key not in base:
            extra = draft_config_keys() if path == "draft." else []
            if key in extra:
                base[key] = value
                continue
            known = ", ".join(path + k for k in [*base, *(k for k in extra if k not in base)])
            raise KeyError(f"Unknown recipe key `{path}{key}`. Known keys: {known}")
        section = schema.get(key) if isinstance(schema, dict) else None
        if isinstance(section, dict) and not isinstance(value, dict):
            raise ValueError(f"`{path}{key}` is a section of keys ({', '.join(section)}), got {value!r}: write them "
                             f"indented under `{key}:`.")
        if isinstance(section, dict):
            _merge(base[key], value, f"{path}{key}.", section)
        else:
            base[key] = value
    return base


def merge_changes(recipe: dict, changes: dict) -> dict:
    """``recipe`` with the nested ``changes`` merged in (checked against the known keys), in place."""
    return _merge(recipe, changes)


def parse_overrides(pairs: list[str]) -> dict:
    """``["--train.lr", "3e-4", "--data.regenerate", "false"]`` -> nested dict (values parsed as YAML)."""
    out: dict = {}
    i = 0
    while i < len(pairs):
        flag = pairs[i]
        if not flag.startswith("--"):
            raise ValueError(f"Expected a --section.key flag, got {flag!r}")
        if "=" in flag:
            flag, raw = flag.split("=", 1)
            i += 1
        elif i + 1 < len(pairs) and not pairs[i + 1].startswith("--"):
            raw = pairs[i + 1]
            i += 2
        else:
            raw, i = "true", i + 1
            if not isinstance(_default_of(flag[2:].replace("-", "_")), bool):  # only a switch stands alone
                raise ValueError(f"{flag} needs a value, as in `{flag} VALUE` or `{flag}=VALUE` (only true/false "
                                 "keys may be given alone, meaning true).")
        node = out
        keys = flag[2:].replace("-", "_").split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = _load_yaml(raw, f"the value of {flag}")
    return out


def _default_of(dotted: str):
    """The default of the recipe key ``train.lr`` (None for a key that is not a value of ``DEFAULTS``)."""
    node = DEFAULTS
    for k in dotted.split("."):
        if not isinstance(node, dict) or k not in node:
            return None
        node = node[k]
    return node


def load_recipe(path: str | Path | None = None, overrides: dict | None = None) -> dict:
    recipe = copy.deepcopy(DEFAULTS)
    if path is not None:
        with open(path) as f:
            loaded = _load_yaml(f, str(path)) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path} must hold sections of keys (`train:`, `data:`, ...), not a {type(loaded).__name__}: "
                             "see recipes/ for examples.")
        _merge(recipe, loaded)
        check_values(loaded, f"{path}: ")
    if overrides:
        _merge(recipe, overrides)
        check_values(overrides, "", flags=True)
    if recipe["output_dir"] is None:
        recipe["output_dir"] = str(Path(recipe["work_dir"]) / "draft")
    check_output_dir(recipe, f"{path}: " if path is not None else "")
    return recipe


VCS_DIRS = (".git", ".hg", ".svn")
SAVED_MODEL_FILES = {"config.json", "adapter_config.json"}  # a folder holding one is a saved draft (or LoRA adapter)


def check_output_dir(recipe: dict, where: str = "") -> None:
    """The trained draft replaces ``output_dir`` whole at the end of a run, so it must be new, empty or a saved
    draft; never a folder that holds the run's ``work_dir`` or a version-control folder. Checked when the recipe
    is read, before anything is trained."""
    given, out, work = recipe["output_dir"], Path(recipe["output_dir"]).resolve(), Path(recipe["work_dir"]).resolve()
    if out == work or out in work.parents:
        raise ValueError(f"{where}output_dir {given} holds the work_dir {recipe['work_dir']}: the draft replaces "
                         "output_dir whole at the end, with the run's checkpoints and data in it. Give output_dir a "
                         "folder of its own (default: <work_dir>/draft).")
    if any(part in VCS_DIRS for part in out.parts):
        raise ValueError(f"{where}output_dir {given} is inside a version-control folder: give another folder.")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{where}output_dir {given} is a file: give a folder for the draft.")
    names = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if names and (set(names) & set(VCS_DIRS) or not set(names) & SAVED_MODEL_FILES):
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        raise ValueError(f"{where}output_dir {given} holds files that are not a saved draft ({shown}): the trained "
                         "draft replaces that folder whole. Give a new or empty folder, or the folder of a draft to "
                         "replace.")


def stage_from_changes(before: dict, changes: dict, i: int, first_work_dir: str) -> dict:
    """Stage ``i``: the recipe of the stage ``before`` it with ``changes`` merged in. It continues that stage's draft
    (``draft.init_from``), writes where it did unless told otherwise, and has a work_dir of its own."""
    changes = copy.deepcopy(changes)
    stage = copy.deepcopy(before)
    stage["stages"] = []
    stage["draft"]["init_from"] = before["output_dir"]
    stage["work_dir"] = f"{first_work_dir}-stage{i}"
    stage["features"]["reuse_from"] = []  # an earlier run's features are named by each stage that takes them
    added = (changes.get("data") or {}).pop("add_sources", None) if isinstance(changes.get("data"), dict) else None
    if added is not None:
        if not isinstance(added, list):
            raise ValueError(f"stage {i}: data.add_sources must be a list of data sources, got {added!r}")
        earlier = [{"path": src} if isinstance(src, str) else dict(src) for src in stage["data"]["sources"]]
        stage["data"]["sources"] = [{**src, "eval": False} for src in earlier] + added  # trained on by a stage before
    if "stages" in changes:
        raise ValueError(f"stage {i} lists stages of its own: list every stage in the first recipe")
    try:
        _merge(stage, changes)
    except KeyError as e:
        raise KeyError(f"stage {i}: {e.args[0]}") from None
    check_values(changes, f"stage {i}: ")
    return stage


def check_stage_number(chain: list[dict], from_stage: int) -> None:
    """``--from-stage N`` names a stage of the recipe: 1 to the number of stages."""
    if isinstance(from_stage, bool) or not isinstance(from_stage, int) or not 1 <= from_stage <= len(chain):
        have = "stage 1 only" if len(chain) == 1 else f"stages 1 to {len(chain)}"
        raise ValueError(f"--from-stage {from_stage}: the recipe has {have}; pass a stage number in that range.")


def load_stages(recipe: dict, overrides: dict | None = None) -> list[dict]:
    """The recipe and its later ``stages``, each with ``overrides`` applied (but for ``FIRST_STAGE_ONLY`` keys) and
    checked to continue the draft the stage before writes; raises before anything is trained."""
    stages = recipe["stages"]
    if not isinstance(stages, list) or not all(isinstance(p, (str, dict)) for p in stages):
        raise ValueError(f"stages must be a list of changes to the stage before (mappings) or recipe files, got {stages!r}")
    later = {k: v for k, v in (overrides or {}).items() if k not in FIRST_STAGE_ONLY}
    chain = [recipe]
    for i, item in enumerate(stages, start=2):
        if isinstance(item, dict):
            stage = _merge(stage_from_changes(chain[-1], item, i, recipe["work_dir"]), copy.deepcopy(later))
            path = f"(stages[{i - 2}])"
        else:
            path = item
            if not Path(path).is_file():
                raise ValueError(f"stage {i} recipe {path} not found (stages are paths from the directory you run in)")
            stage = load_recipe(path, later)
        if stage["stages"]:
            raise ValueError(f"stage {i} recipe {path} lists stages of its own: list every stage in the first recipe")
        check_output_dir(stage, f"stage {i}: ")
        before, init = chain[-1]["output_dir"], stage["draft"]["init_from"]
        if init is None or Path(init).resolve() != Path(before).resolve():
            raise ValueError(f"stage {i} recipe {path} must continue the draft of stage {i - 1}: its draft.init_from "
                             f"is {init!r}, but stage {i - 1} writes {before}")
        work = Path(stage["work_dir"]).resolve()
        used = [j for j, r in enumerate(chain, start=1) if Path(r["work_dir"]).resolve() == work]
        if used:
            raise ValueError(f"stage {i} recipe {path} has the work_dir of stage {used[0]} ({stage['work_dir']}): "
                             "give every stage its own work_dir")
        chain.append(stage)
    return chain
