"""``eagle3-hub convert``: read a draft in any layout (folder or Hub id), check it against a target, write it as
ours or an engine's layout."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..modeling_eagle3 import Eagle3DraftModel
from .aux_layers import engine_default_aux_layer_ids, resolve_aux_layer_ids
from .engines import export_draft
from .files import read_config_dict, resolve_folder, tensor_shapes
from .layouts import detect_layout


def _meta_target(target: str):
    """The target built from its config on the meta device (no weights read), for ``Eagle3DraftModel.check_fits``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(target)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


VCS_DIRS = (".git", ".hg", ".svn")


def check_destination(src, folder: Path, dst, force: bool) -> None:
    """Refuse a destination whose replacement would destroy the draft being read (``dst`` is ``src`` or holds it)
    or a version-control folder, whatever ``force`` says: ``--force`` replaces an older output, never those."""
    dst = Path(dst).resolve()
    sources = {Path(folder).resolve()} | ({Path(src).resolve()} if Path(str(src)).exists() else set())
    for source in sources:
        if dst == source or dst in source.parents:
            raise ValueError(
                f"{dst} {'is' if dst == source else 'holds'} the draft being converted ({source}): writing "
                "there would delete it. Give another destination folder."
            )
    if force and dst.is_dir():
        found = _vcs_inside(dst)
        if found is not None:
            raise ValueError(
                f"{dst} holds a version-control folder ({found}): --force never replaces one. Give another destination folder."
            )


def _vcs_inside(folder: Path) -> Path | None:
    """The first ``.git`` / ``.hg`` / ``.svn`` (folder, or a worktree's ``.git`` file) at any depth of ``folder``, or
    ``folder`` itself when it is one: what ``--force`` would delete with the rest."""
    if folder.name in VCS_DIRS:
        return folder
    for root, dirs, files in os.walk(folder):  # links are not followed: the output's removal does not follow them
        for name in (*dirs, *files):
            if name in VCS_DIRS:
                return Path(root) / name
    return None


def convert(
    src,
    dst,
    to: str = "ours",
    target: str | None = None,
    aux_layer_ids: list[int] | None = None,
    verifier: str | None = None,
    num_speculative_tokens: int = 3,
    force: bool = False,
    aux_layer_convention: str | None = None,
) -> Path:
    """Rewrite the draft at ``src`` (any layout, folder or Hub id) as ``to`` at ``dst``; returns ``dst``.

    ``target``: the target (Hub id or folder; only its config is read) to check the draft against and to resolve
    the aux layers of drafts that do not list them. ``aux_layer_ids``: our convention (layer outputs).
    ``aux_layer_convention``: how to read the ids ``src``'s config lists (``"input"`` or ``"output"``).
    """
    from ..targets import check_aux_layer_ids

    meta_target = _meta_target(target) if target else None
    folder = resolve_folder(src)
    check_destination(src, folder, dst, force)
    layout = detect_layout(read_config_dict(folder), tensor_shapes(folder), str(src))
    L = meta_target.config.get_text_config().num_hidden_layers if meta_target is not None else None
    if aux_layer_ids is not None and L is not None:
        check_aux_layer_ids(aux_layer_ids, L)
    options = {"aux_layer_convention": aux_layer_convention} if aux_layer_convention else {}
    if layout == "ours":
        draft = Eagle3DraftModel.from_pretrained(str(folder), dtype="auto", **options)
        if aux_layer_ids is not None:
            draft.config.aux_layer_ids = aux_layer_ids
    else:
        draft = Eagle3DraftModel.from_pretrained(str(folder), aux_layer_ids=aux_layer_ids, target=None, dtype="auto", **options)
        if draft.config.aux_layer_ids is None and L is not None:
            draft.config.aux_layer_ids = engine_default_aux_layer_ids(L)
        elif L is not None and aux_layer_ids is None:  # re-read ambiguous ids knowing the target's depth
            ids = resolve_aux_layer_ids(read_config_dict(folder), layout, str(src), L, aux_layer_convention)
            if ids is not None:
                draft.config.aux_layer_ids = ids
    cfg = draft.config
    if meta_target is not None:
        try:
            draft.check_fits(meta_target)
        except ValueError as e:
            raise ValueError(f"{src} does not fit the target {target}: {e}") from None
        cfg.target_num_hidden_layers = L
        cfg.target_model_type = cfg.target_model_type or meta_target.config.get_text_config().model_type
    if cfg.aux_layer_ids is None:
        raise ValueError(
            f"{src} does not list its aux layers. Pass --target (the engines' default for its depth is used) or "
            "--aux-layer-ids LOW,MID,HIGH (0-based target layer outputs)."
        )
    if verifier is None and target is not None and not Path(target).exists():
        verifier = target
    if to == "vllm" and meta_target is not None and draft._embedding_missing:
        _carry_target_embedding(draft, target, meta_target)
    return export_draft(
        draft,
        dst,
        to,
        verifier=verifier,
        num_speculative_tokens=num_speculative_tokens,
        force=force,
        verifier_architectures=meta_target.config.architectures if meta_target is not None else None,
    )


def _carry_target_embedding(draft, target: str, meta_target) -> None:
    """Give a draft without ``embed_tokens`` its target's, read from the target's safetensors (that tensor only),
    so that the speculators export carries it: speculators' loader reads the draft's embedding, see export_draft."""
    from .files import read_embedding

    weight = meta_target.get_input_embeddings().weight
    name = next(n for n, p in meta_target.named_parameters() if p is weight)
    embedding = read_embedding(target, name)
    if embedding is None:
        return  # export_draft warns that the export carries no embedding
    embedding = embedding[: draft.config.vocab_size].to(draft.fc.weight.dtype)
    draft.embed_tokens.weight = torch.nn.Parameter(embedding, requires_grad=False)
    draft._embedding_from_target = True
