"""What a draft's card says of its target: the target's Hub id, and its licence terms (a local folder's card or
config, a GGUF file's metadata, a named target's package, or the Hub card when online)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from .network import is_network_error
from .targets import is_embedded, named_target

logger = logging.getLogger(__name__)

EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
HUB_ID_PATTERN = re.compile(r"[\w.-]+/[\w.-]+")


def target_hub_id(target: str | None) -> str | None:
    """The Hub id of a target spec: the embedded SmolLM2's origin, a named target's origin (``--target
    gemma-3-270m``), a repo id as is, ``None`` for local paths."""
    if is_embedded(target):
        return EMBEDDED_HUB_ID
    if named_target(target) is not None:
        return named_target(target).hub_id
    if Path(target).expanduser().exists():
        return None
    return target if HUB_ID_PATTERN.fullmatch(target) else None


def gguf_metadata_value(path: str | Path, key: str):
    """One metadata value of a GGUF file (``gguf``'s reader maps the file; no tensor is read), None when absent.
    A file that is not GGUF is a ``ValueError``."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).get_field(key)
    return None if field is None else field.contents()


def _gguf_license(path: Path) -> str | None:
    try:
        value = gguf_metadata_value(path, "general.license")
    except (OSError, KeyError, ValueError):
        return None
    return str(value) if value else None


def target_license(target: str | None, timeout: float = 10.0) -> dict:
    """``{"license": ..., "license_name": ..., "license_link": ...}`` (only the keys found) of a target: from a
    local folder's README.md or config.json, a GGUF file's metadata, or the Hub model card when online."""
    from huggingface_hub import ModelCard

    if is_embedded(target):
        from .targets import EMBEDDED_GGUF, embedded_gguf_dir

        lic = _gguf_license(embedded_gguf_dir() / EMBEDDED_GGUF)
        return {"license": lic} if lic else {}
    spec = named_target(target)
    if spec is not None:  # its terms, as its package states them (a draft trained on its outputs carries them)
        return {k: v for k, v in (("license", spec.license), ("license_link", spec.license_link)) if v}
    path = Path(target).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        lic = _gguf_license(path)
        return {"license": lic} if lic else {}
    if path.is_dir():
        if (path / "README.md").is_file():
            data = ModelCard.load(path / "README.md", ignore_metadata_errors=True).data.to_dict()
            found = {k: data[k] for k in ("license", "license_name", "license_link") if data.get(k)}
            if found:
                return found
        if (path / "config.json").is_file():
            lic = json.loads((path / "config.json").read_text()).get("license")
            if lic:
                return {"license": lic}
        for gguf in sorted(path.glob("*.gguf")):
            lic = _gguf_license(gguf)
            if lic:
                return {"license": lic}
        return {}
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE or not HUB_ID_PATTERN.fullmatch(str(target)):
        return {}
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        card = HfApi().model_info(target, timeout=timeout).card_data
    except Exception as e:  # unknown, gated or unreachable: said; anything else is a bug and propagates
        if not (isinstance(e, (HfHubHTTPError, OfflineModeIsEnabled, OSError)) or is_network_error(e)):
            raise
        logger.warning(
            "Could not read the license of %s from the Hub (%s); the card names none: pass --license.",
            target,
            " ".join(str(e).split()) or type(e).__name__,
        )
        return {}
    data = card.to_dict() if card is not None else {}
    return {k: data[k] for k in ("license", "license_name", "license_link") if data.get(k)}
