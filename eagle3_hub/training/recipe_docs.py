"""The recipe's schema written out for people: a commented YAML recipe of every key (``eagle3-hub train
--show-recipe-schema``) and the key tables of docs/training.md, which a test keeps equal to the schema.

    python -m eagle3_hub.training.recipe_docs docs/training.md     # rewrite the tables from the schema
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

from .recipe_schema import AnswerSetting, Recipe, Source, defaults, field_expected, sections

TOP_LEVEL = "top level"  # the table of the keys outside every section
# in docs/training.md, each table sits between these lines (SECTION: target, draft, ..., or TOP_LEVEL)
BEGIN, END = "<!-- recipe-keys: {} (written by python -m eagle3_hub.training.recipe_docs) -->", "<!-- /recipe-keys -->"
ENTRIES = {"data.sources": Source, "data.answer_sampling": AnswerSetting}  # the keys of a list's mappings
DRAFT_CONFIG_NOTE = (
    "and any Eagle3Config parameter the target does not fix (fc_norm, norm_output, rms_norm_eps, "
    "num_attention_heads, ...): docs/training.md, Architecture keys"
)


def _value(v) -> str:
    """A default as a recipe writes it: ``null``, ``true``, ``[0.9, 0.95]``, ``runs/draft``."""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return json.dumps(v)


def _fields(section: str) -> dict:
    """The keys of ``section`` (TOP_LEVEL: the recipe's own), their field infos."""
    if section == TOP_LEVEL:
        return {k: f for k, f in Recipe.model_fields.items() if k not in sections()}
    return {**sections(), **ENTRIES}[section].model_fields


def markdown_table(section: str) -> str:
    """The docs' table of one section: key, type, default, meaning."""
    cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731
    rows = ["| Key | Type | Default | Meaning |", "|---|---|---|---|"]
    for key, info in _fields(section).items():
        default = _value(info.get_default(call_default_factory=True)) if not info.is_required() else "required"
        rows.append(f"| `{key}` | {cell(field_expected(info))} | `{cell(default)}` | {cell(info.description)} |")
    return "\n".join(rows)


def update_docs(text: str) -> str:
    """``text`` (docs/training.md) with every table between the markers written anew from the schema."""
    for section in [*sections(), *ENTRIES, TOP_LEVEL]:
        begin = BEGIN.format(section)
        pattern = re.compile(re.escape(begin) + r"\n.*?\n" + re.escape(END), re.S)
        if not pattern.search(text):
            raise ValueError(f"the docs have no table for `{section}`: add the lines {begin} and {END} where it goes")
        text = pattern.sub(lambda _: f"{begin}\n{markdown_table(section)}\n{END}", text)
    return text


def _comment(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, 116 - len(indent), initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ")


def schema_text() -> str:
    """The whole schema as a recipe of the defaults: each key under comments that say its type and meaning."""
    lines = [
        "# An eagle3-hub training recipe with every key at its default: above each key, what it must be and what",
        "# it does. Any key is also a flag: --section.key VALUE (e.g. --train.lr 3e-4).",
    ]
    values = defaults()
    for section in [*sections(), TOP_LEVEL]:
        indent = "" if section == TOP_LEVEL else "  "
        if section != TOP_LEVEL:
            lines += ["", *_comment(f"{section}: {Recipe.model_fields[section].description}", ""), f"{section}:"]
            if section == "draft":
                lines += _comment(f"the keys below, {DRAFT_CONFIG_NOTE}", indent)
        else:
            lines.append("")
        for key, info in _fields(section).items():
            default = values[key] if section == TOP_LEVEL else values[section][key]
            lines += _comment(f"{field_expected(info)}: {info.description}", indent)
            for sub, entry in _fields(f"{section}.{key}").items() if f"{section}.{key}" in ENTRIES else ():
                what = "required" if entry.is_required() else f"default {json.dumps(entry.get_default())}"
                lines += _comment(f"- {sub} ({field_expected(entry)}, {what}): {entry.description}", indent + "  ")
            lines.append(f"{indent}{key}: {json.dumps(default)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    for name in sys.argv[1:] or ["docs/training.md"]:
        path = Path(name)
        path.write_text(update_docs(path.read_text()))
        print(f"wrote the recipe key tables of {path}")
