"""``eagle3-hub push``: upload a draft folder to the Hugging Face Hub (``HfApi.create_repo`` + one commit).

What goes up: the files inside the folder (a link that leaves it is skipped, said in a line; a folder whose only
weights are a pickle is refused): its safetensors weights, ``config.json``, generation config, the code files that
``trust_remote_code`` needs (taken from the package when the folder lacks them), the model card (written when
the folder has none, refreshed when it is one eagle3-hub wrote) and the bench chart. Nothing in the folder is
deleted or changed except that card.

The token comes from ``--token``, then the usual places (``HF_TOKEN``, ``hf auth login``). Offline, without a
token, or without write access the push stops with a message that says what to do; the folder stays as it is.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
from pathlib import Path

from .formats import CODE_FILES  # the code files trust_remote_code needs
from .network import is_network_error

logger = logging.getLogger(__name__)

# files of a training run that do not belong in a published draft
IGNORE_PATTERNS = [
    ".*",
    "__pycache__",
    "*.pyc",
    "checkpoint-*",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state*.pth",
    "trainer_state.json",
    "events.out.tfevents.*",
    "runs",
    "*.tmp",
]
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


class HubPushError(RuntimeError):
    """A push that could not happen; the message says why and what to do."""


class NotADraftFolder(HubPushError, ValueError):
    """The folder to push is not a saved draft: bad input, caught before anything is sent."""


def _ignored(rel: Path, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in patterns)


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path``, its links followed, lies in ``folder`` (resolved)."""
    return path.resolve().is_relative_to(folder)


def folder_files(folder: Path, patterns: list[str]) -> dict[str, Path]:
    """``{relative path: file}`` under ``folder``, minus ``patterns``. A link whose target leaves the folder is skipped,
    with a line saying so (a link to the Hub token file must never be uploaded); links to folders are not followed."""
    real = folder.resolve()
    files = {}
    for root, dirs, names in os.walk(folder):  # followlinks=False: a linked folder is listed, never entered
        dirs[:] = [d for d in dirs if not _ignored((Path(root) / d).relative_to(folder), patterns)]
        for name in sorted([*names, *(d for d in dirs if os.path.islink(os.path.join(root, d)))]):
            path = Path(root) / name
            rel = path.relative_to(folder)
            if _ignored(rel, patterns):
                continue
            if path.is_symlink() and (not _inside(path, real) or path.is_dir()):
                logger.warning(
                    "Not uploading %s: a link to %s, %s.",
                    path,
                    os.path.realpath(path),
                    f"outside {folder}" if not _inside(path, real) else "a folder (links to folders are not followed)",
                )
                continue
            if path.is_file():
                files[rel.as_posix()] = path
    return dict(sorted(files.items()))


def files_to_upload(folder: str | Path, ignore_patterns: list[str] | None = None) -> dict[str, Path]:
    """``{path_in_repo: local file}``: the folder's files minus training leftovers and links that leave it, plus the
    code files that ``config.json``'s ``auto_map`` needs and ``custom_generate/`` (tree decoding), where the folder
    lacks them."""
    folder = Path(folder)
    patterns = IGNORE_PATTERNS if ignore_patterns is None else ignore_patterns
    files = folder_files(folder, patterns)
    config = json.loads((folder / "config.json").read_text())
    needed = {ref.split(".")[0] + ".py" for ref in (config.get("auto_map") or {}).values() if isinstance(ref, str)}
    if needed & set(CODE_FILES):
        needed |= set(CODE_FILES)  # modeling imports the assistant mixin and the config
    package = Path(__file__).resolve().parent
    sources = {name: package / name for name in needed}
    if needed & set(CODE_FILES):  # tree decoding for `target.generate(custom_generate=repo)`
        from .generation.tree import custom_generate_files

        sources.update(custom_generate_files())
    for name, src in sorted(sources.items()):
        if name not in files and src.is_file():
            files[name] = src
    return files


def check_draft_folder(folder: str | Path) -> Path:
    folder = Path(folder)
    if not folder.is_dir():
        raise NotADraftFolder(f"{folder} is not a folder. Pass the folder of a saved draft (`draft.save_pretrained(folder)`).")
    if not (folder / "config.json").is_file():
        raise NotADraftFolder(f"{folder} has no config.json: is it a saved draft (`draft.save_pretrained(folder)`)?")
    real = folder.resolve()
    if not any(_inside(p, real) and p.is_file() for p in folder.glob("*.safetensors")):
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
        if pickles:
            raise NotADraftFolder(
                f"{folder} holds its weights only as a pickle ({', '.join(pickles)}): eagle3-hub "
                "publishes safetensors only: load the draft where it was trained and save it with "
                "`draft.save_pretrained(folder)`, which writes model.safetensors."
            )
        raise NotADraftFolder(
            f"{folder} has no weights (*.safetensors): save the draft with `draft.save_pretrained(folder)` first."
        )
    return folder


def _explain(error: Exception, endpoint: str, folder: Path, repo_id: str | None = None) -> HubPushError:
    """A Hub error as a message that says what to do."""
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError, OfflineModeIsEnabled

    keep = f" Nothing was changed in {folder}."
    if isinstance(error, LocalTokenNotFoundError):
        return HubPushError(
            "No Hugging Face token found. Log in with `hf auth login`, set HF_TOKEN, or pass --token "
            "(a token with write access: https://huggingface.co/settings/tokens)." + keep
        )
    if isinstance(error, OfflineModeIsEnabled):
        return HubPushError("HF_HUB_OFFLINE is set: cannot upload. Unset it and push again once online." + keep)
    if is_network_error(error):
        return HubPushError(
            f"Cannot reach the Hub at {endpoint} ({type(error).__name__}). Check the connection "
            "(or HF_ENDPOINT) and push again." + keep
        )
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        status = error.response.status_code
        if status == 401:
            return HubPushError(
                "The Hub rejected the token (401 Unauthorized). Log in again with `hf auth login --force` "
                "or set a valid HF_TOKEN." + keep
            )
        if status == 403:
            return HubPushError(
                f"The token may not write to {repo_id or 'this repository'} (403 Forbidden): use a token "
                "with write access, or a namespace you own or belong to." + keep
            )
        return HubPushError(f"The Hub answered {status}: {str(error).splitlines()[0]}." + keep)
    return HubPushError(f"Upload failed: {type(error).__name__}: {error}." + keep)


def push_draft(
    folder: str | Path,
    repo_id: str,
    private: bool = False,
    token: str | None = None,
    commit_message: str | None = None,
    endpoint: str | None = None,
    update_card: bool = True,
    ignore_patterns: list[str] | None = None,
    training_info: dict | None = None,
) -> str:
    """Create ``repo_id`` (``name`` alone means your own namespace) and upload the draft in ``folder`` in one
    commit. Returns the URL of the commit. Raises :class:`HubPushError` with a clear message on failure.
    ``update_card``: write README.md for the repo first (unless the folder holds a card not written by eagle3-hub),
    with ``training_info`` (``eagle3_hub.publish.push`` reads the folder's training metrics into it)."""
    from huggingface_hub import CommitOperationAdd, HfApi, constants, get_token

    from .card import check_repo_id

    folder = check_draft_folder(folder)
    check_repo_id(repo_id)
    endpoint = endpoint or constants.ENDPOINT
    token = token or get_token()
    if not token:
        from huggingface_hub.errors import LocalTokenNotFoundError

        raise _explain(LocalTokenNotFoundError("no token"), endpoint, folder)
    api = HfApi(endpoint=endpoint, token=token)
    try:
        user = api.whoami()["name"]
        if "/" not in repo_id:
            repo_id = f"{user}/{repo_id}"
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    except Exception as e:
        raise _explain(e, endpoint, folder, repo_id) from e

    if update_card:
        from .card import card_is_ours, write_model_card

        readme = folder / "README.md"
        if not readme.exists() or card_is_ours(readme):
            write_model_card(folder, repo_id=repo_id, training_info=training_info)
    files = files_to_upload(folder, ignore_patterns)
    operations = [CommitOperationAdd(path_in_repo=path, path_or_fileobj=str(local)) for path, local in files.items()]
    try:
        info = api.create_commit(
            repo_id,
            operations,
            repo_type="model",
            commit_message=commit_message or "Upload EAGLE-3 draft with eagle3-hub",
        )
    except Exception as e:
        raise _explain(e, endpoint, folder, repo_id) from e
    return info.commit_url
