"""Reading a draft's folder (local or a Hub snapshot): config.json and safetensors headers. Pickled weights are
refused with a message naming them, never downloaded or unpickled."""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors import SafetensorError, safe_open

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def resolve_folder(
    path_or_repo: str | os.PathLike,
    *,
    subfolder: str = "",
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool = False,
    force_download: bool = False,
) -> Path:
    """A local folder holding the draft's config and safetensors: ``path_or_repo`` itself or a Hub snapshot
    (json files and ``*.safetensors`` only: pickled weights are never downloaded)."""
    local = Path(path_or_repo).expanduser()
    if local.is_dir():
        folder = local / subfolder if subfolder else local
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} has no config.json: it is not a saved draft folder.")
        return folder
    if local.exists() or local.is_absolute() or str(path_or_repo).startswith((".", "~")):
        raise FileNotFoundError(f"{path_or_repo} is not a folder: pass a saved draft folder or a Hub repo id.")
    from huggingface_hub import snapshot_download

    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    snapshot = snapshot_download(
        str(path_or_repo),
        revision=revision,
        cache_dir=cache_dir,
        token=token,
        local_files_only=local_files_only,
        force_download=force_download,
        allow_patterns=[f"{prefix}*.json", f"{prefix}*.safetensors"],
    )
    folder = Path(snapshot) / subfolder if subfolder else Path(snapshot)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{path_or_repo} has no config.json{f' in {subfolder}' if subfolder else ''}.")
    if not any(folder.glob("*.safetensors")) and not local_files_only:
        # the snapshot skipped pickles on purpose: name them from the repo's file list, never download them
        try:
            from huggingface_hub import HfApi

            names = HfApi().list_repo_files(str(path_or_repo), revision=revision, token=token)
        except Exception:  # offline or no access: the plain "no weights" error follows
            names = []
        pickles = sorted(
            n[len(prefix) :]
            for n in names
            if n.startswith(prefix) and "/" not in n[len(prefix) :] and n.endswith(PICKLE_SUFFIXES)
        )
        if pickles:
            raise ValueError(_pickle_message(f"The Hub repo {path_or_repo}", pickles))
    return folder


def _pickle_message(what: str, pickles: list[str]) -> str:
    return (
        f"{what} has only pickled weights ({', '.join(pickles)}) and no *.safetensors. eagle3-hub reads safetensors "
        "only and never unpickles weights, because loading a pickle can run arbitrary code. Convert the file to "
        "model.safetensors with a tool you trust (for a Hub repo: the 'convert to safetensors' Space, or ask its "
        "authors), then load that."
    )


def read_config_dict(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{path} is not valid JSON ({e}): the file is corrupt or truncated; download or export the draft again."
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a JSON {type(config).__name__}, not an object: it is not a model config.")
    return config


def safetensors_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint; a clear error for pickled-only checkpoints."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if files:
        index = folder / "model.safetensors.index.json"
        if index.is_file():  # sharded: only the shards the index names
            try:
                with open(index, encoding="utf-8") as f:
                    names = sorted(set(json.load(f)["weight_map"].values()))
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"{index} is not a valid safetensors index ({e!r}); download the draft again.") from None
            files = [folder / n for n in names]
        return files
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(_pickle_message(str(folder), pickles))
    raise FileNotFoundError(f"{folder} has no weights: expected model.safetensors (or sharded *.safetensors).")


def tensor_shapes(folder: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) read from the safetensors headers, without loading any tensor. A truncated or corrupt
    file is a ValueError naming it."""
    shapes = {}
    for file in safetensors_files(folder):
        if not file.is_file():
            raise FileNotFoundError(f"{file} is named by the safetensors index but missing: download the draft again.")
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    shapes[name] = (tuple(sl.get_shape()), sl.get_dtype())
        except (SafetensorError, OSError) as e:
            raise ValueError(
                f"{file} is not a readable safetensors file ({e}): it is truncated or corrupt; download or export the "
                "draft again."
            ) from None
    return shapes


def read_embedding(path_or_repo: str | os.PathLike, name: str):
    """The tensor ``name`` (a target's input embedding, e.g. ``model.embed_tokens.weight``) from a model folder or
    Hub repo, reading only the safetensors file that holds it; a checkpoint that names it otherwise is searched for
    the one tensor ending in ``embed_tokens.weight``. None where no such tensor is found."""
    local = Path(path_or_repo).expanduser()
    if local.is_dir():
        folder = local
    else:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(str(path_or_repo), allow_patterns=["*.json"]))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
    elif local.is_dir():
        weight_map = {}
        for file in safetensors_files(folder):
            with safe_open(str(file), framework="pt") as f:
                weight_map.update(dict.fromkeys(f.keys(), file.name))
    else:
        weight_map = None  # one file: its header is read below
    if weight_map is None:
        from huggingface_hub import hf_hub_download

        file = Path(hf_hub_download(str(path_or_repo), "model.safetensors"))
        with safe_open(str(file), framework="pt") as f:
            weight_map = dict.fromkeys(f.keys(), file.name)
        folder = file.parent
    key = name if name in weight_map else None
    if key is None:
        candidates = [k for k in weight_map if k.endswith("embed_tokens.weight")]
        key = candidates[0] if len(candidates) == 1 else None
    if key is None:
        return None
    file = folder / weight_map[key]
    if not file.is_file():
        from huggingface_hub import hf_hub_download

        file = Path(hf_hub_download(str(path_or_repo), weight_map[key]))
    with safe_open(str(file), framework="pt") as f:
        return f.get_tensor(key)
