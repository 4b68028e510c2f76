"""Training recipes: a YAML file of nested sections; every key is also a CLI flag (``--train.lr 3e-4``)."""

from __future__ import annotations

import copy
import difflib
import inspect
import re
from pathlib import Path

import yaml

from . import recipe_schema

DEFAULTS: dict = recipe_schema.defaults()  # every key, its type, range and meaning: recipe_schema.Recipe
# keys a command-line override sets for the first recipe only, not for its later stages
FIRST_STAGE_ONLY = ("stages", "work_dir", "output_dir")


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
    re.compile(
        r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
        r"|[0-9][0-9_]*[eE][-+]?[0-9]+|\.(?:inf|Inf|INF)|[-+]\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
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
        raise ValueError(
            f"{where} is not valid YAML{at}: {problem}. Fix that line (`key: value` pairs, nested sections "
            "indented by two spaces; quote a value that holds ': ' or ' #')."
        ) from None
    except yaml.YAMLError as e:
        raise ValueError(f"{where} is not valid YAML: {' '.join(str(e).split())}") from None


# Eagle3Config parameters that describe the target (read from it: the draft shares its embedding and reads its
# features) or that the draft section already names; every other parameter is a `draft:` key of the recipe
# (e.g. `fc_norm: true`) passed to the config of a new draft.
_SET_BY_TRAINING = {
    "self",
    "kwargs",
    "vocab_size",
    "hidden_size",
    "target_hidden_size",
    "eagle_config",
    "target_num_hidden_layers",
    "target_model_type",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "draft_vocab_size",
    "intermediate_size",
}


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
            names = [*base, *(k for k in extra if k not in base)]
            near = difflib.get_close_matches(key, names, 1, cutoff=0.5)
            hint = f" (did you mean `{path}{near[0]}`?)" if near else ""
            raise KeyError(f"Unknown recipe key `{path}{key}`{hint}. Known keys: {', '.join(path + k for k in names)}")
        section = schema.get(key) if isinstance(schema, dict) else None
        if isinstance(section, dict) and not isinstance(value, dict):
            raise ValueError(
                f"`{path}{key}` is a section of keys ({', '.join(section)}), got {value!r}: write them indented under `{key}:`."
            )
        if isinstance(section, dict):
            _merge(base[key], value, f"{path}{key}.", section)
        else:
            base[key] = value
    return base


def merge_changes(recipe: dict, changes: dict) -> dict:
    """``recipe`` with the nested ``changes`` merged in (checked against the known keys), in place."""
    return _merge(recipe, changes)


def parse_overrides(pairs: list[str]) -> dict:
    """``["--train.lr", "3e-4", "--data.regenerate", "false"]`` -> nested dict. A value is read as the schema says:
    YAML (``3e-4``, ``[0.9, 0.95]``, ``null``), but the text as given for a key that holds text (``--target.chat_template
    '{{ bos_token }}...'``, ``null`` still null where null is allowed); a flag alone is true, for a true/false key only."""
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
            if not recipe_schema.is_switch(flag[2:].replace("-", "_")):  # only a switch stands alone
                raise ValueError(
                    f"{flag} needs a value, as in `{flag} VALUE` or `{flag}=VALUE` (only true/false "
                    "keys may be given alone, meaning true)."
                )
        dotted = flag[2:].replace("-", "_")
        node = out
        keys = dotted.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        text = recipe_schema.takes_text(dotted)
        node[keys[-1]] = (
            (None if raw == "null" and text == "or null" else raw) if text else _load_yaml(raw, f"the value of {flag}")
        )
    return out


def load_recipe(path: str | Path | None = None, overrides: dict | None = None) -> dict:
    """The recipe of the YAML file ``path`` (None: the defaults) with the nested ``overrides`` (``--section.key``
    flags) merged in, every value checked against ``recipe_schema.Recipe``; one line names a bad key or value."""
    recipe = copy.deepcopy(DEFAULTS)
    if path is not None:
        with open(path) as f:
            loaded = _load_yaml(f, str(path)) or {}
        if not isinstance(loaded, dict):
            raise ValueError(
                f"{path} must hold sections of keys (`train:`, `data:`, ...), not a {type(loaded).__name__}: "
                "see recipes/ for examples."
            )
        _merge(recipe, loaded)
        recipe_schema.validate(recipe, f"{path}: ")
    if overrides:
        _merge(recipe, overrides)
        recipe_schema.validate(recipe, "", flags=True)
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
        raise ValueError(
            f"{where}output_dir {given} holds the work_dir {recipe['work_dir']}: the draft replaces "
            "output_dir whole at the end, with the run's checkpoints and data in it. Give output_dir a "
            "folder of its own (default: <work_dir>/draft)."
        )
    if any(part in VCS_DIRS for part in out.parts):
        raise ValueError(f"{where}output_dir {given} is inside a version-control folder: give another folder.")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{where}output_dir {given} is a file: give a folder for the draft.")
    names = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if names and (set(names) & set(VCS_DIRS) or not set(names) & SAVED_MODEL_FILES):
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        raise ValueError(
            f"{where}output_dir {given} holds files that are not a saved draft ({shown}): the trained "
            "draft replaces that folder whole. Give a new or empty folder, or the folder of a draft to "
            "replace."
        )


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
    if added is not None:  # the sources' own schema (data.sources), said of the key the stage wrote
        try:
            recipe_schema.validate_key("data.sources", added)
        except ValueError as e:
            raise ValueError(f"stage {i}: {str(e).replace('data.sources', 'data.add_sources', 1)}") from None
        earlier = [{"path": src} if isinstance(src, str) else dict(src) for src in stage["data"]["sources"]]
        stage["data"]["sources"] = [{**src, "eval": False} for src in earlier] + added  # trained on by a stage before
    if "stages" in changes:
        raise ValueError(f"stage {i} lists stages of its own: list every stage in the first recipe")
    try:
        _merge(stage, changes)
    except KeyError as e:
        raise KeyError(f"stage {i}: {e.args[0]}") from None
    recipe_schema.validate(stage, f"stage {i}: ")
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
            raise ValueError(
                f"stage {i} recipe {path} must continue the draft of stage {i - 1}: its draft.init_from "
                f"is {init!r}, but stage {i - 1} writes {before}"
            )
        work = Path(stage["work_dir"]).resolve()
        used = [j for j, r in enumerate(chain, start=1) if Path(r["work_dir"]).resolve() == work]
        if used:
            raise ValueError(
                f"stage {i} recipe {path} has the work_dir of stage {used[0]} ({stage['work_dir']}): "
                "give every stage its own work_dir"
            )
        chain.append(stage)
    return chain
