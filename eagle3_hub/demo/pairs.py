"""Model pairs of the demo (a target and an EAGLE-3 draft made for it): the pairs file, loading a pair (with a
warm-up race), and the cache that keeps the last one loaded."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path

from ..devices import resolve_device, resolve_dtype
from ..targets import EMBEDDED_TARGET, reference_draft
from .inputs import DemoError, Settings
from .racing import PANE_TITLES, LoadedPair, race

EMBEDDED_PAIR = EMBEDDED_TARGET


@dataclass(frozen=True)
class ModelPair:
    """A target and an EAGLE-3 draft made for it.

    target: Hub repo id, local folder, ``.gguf`` path, or ``smollm2-135m-instruct`` (the embedded default).
    draft: Hub repo id, local folder, or ``reference`` (the draft shipped in ``eagle3_hub/reference_draft/<name>``).
    dtype: ``auto`` (bfloat16 on GPUs and on CPUs with bf16 units, as the bench runs), ``float32``, ``bfloat16`` or
    ``float16``; device: ``auto`` (CUDA when present), ``cpu``, ``cuda``, ...
    temperature: the page's starting temperature (0 = greedy); the tree settings start at that mode's defaults.
    """

    name: str
    target: str = EMBEDDED_PAIR
    draft: str = "reference"
    label: str = ""
    dtype: str = "auto"
    device: str = "auto"
    temperature: float = 0.7  # chat users sample

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 2:
            raise DemoError(f"pair {self.name!r}: temperature must be a number from 0 (greedy) to 2, got {t!r}")

    @property
    def title(self) -> str:
        return self.label or f"{self.target} + {self.draft}"


DEFAULT_PAIRS = {
    EMBEDDED_PAIR: ModelPair(
        name=EMBEDDED_PAIR,
        target=EMBEDDED_PAIR,
        draft="reference",
        label="SmolLM2-135M-Instruct (embedded) + reference EAGLE-3 draft",
    )
}


def load_pairs(path: str | Path) -> tuple[dict[str, ModelPair], str]:
    """Read a pairs file: ``{default: NAME, pairs: {NAME: {target, draft, label, dtype, device, temperature}}}``.
    Returns (pairs by name, default name)."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as e:
        raise DemoError(f"Model pairs file {path} not found.") from e
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise DemoError(f"Model pairs file {path} is not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise DemoError(f"{path} is not a mapping: write `pairs: {{NAME: {{target, draft}}}}` (see spaces/pairs.yaml).")
    raw = data.get("pairs")
    if not isinstance(raw, dict) or not raw:
        raise DemoError(f"{path} has no `pairs:` mapping (name -> {{target, draft}}).")
    known = {"target", "draft", "label", "dtype", "device", "temperature"}
    pairs = {}
    for name, spec in raw.items():
        spec = spec or {}
        unknown = set(spec) - known
        if unknown:
            raise DemoError(f"{path}: pair {name!r} has unknown keys {sorted(unknown)}; allowed: {sorted(known)}.")
        if "target" not in spec or "draft" not in spec:
            raise DemoError(f"{path}: pair {name!r} needs both `target` and `draft`.")
        pairs[str(name)] = ModelPair(name=str(name), **{k: v if k == "temperature" else str(v) for k, v in spec.items()})
    default = str(data.get("default") or next(iter(pairs)))
    if default not in pairs:
        raise DemoError(f"{path}: default pair {default!r} is not one of {sorted(pairs)}.")
    return pairs, default


def resolve_draft(pair: ModelPair) -> str:
    """Folder or repo id of a pair's draft; a clear error when the reference draft is not installed."""
    if pair.draft in ("reference", "") or pair.draft.startswith("reference:"):
        name = pair.draft.partition(":")[2] or pair.target
        folder = reference_draft(name)
        if not (folder / "config.json").exists():
            raise DemoError(
                f"The reference EAGLE-3 draft for {name} is not in this install (looked in {folder}). "
                "Train one with `eagle3-hub train` and start the demo with `--draft PATH`, "
                "or choose another model pair."
            )
        return str(folder)
    path = Path(pair.draft).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise DemoError(f"Draft folder {path} has no config.json: is it a saved EAGLE-3 draft?")
        return str(path)
    return pair.draft


def load_pair(pair: ModelPair) -> LoadedPair:
    """Load target and draft, bind them, and run one short warm-up race (so that first-call costs do not
    count against either pane)."""
    from ..generation.tree import load_draft
    from ..targets import load_target

    draft_path = resolve_draft(pair)
    try:
        device = resolve_device(pair.device)
        dtype = resolve_dtype(pair.dtype, device)
    except ValueError as e:
        raise DemoError(f"Pair {pair.name!r}: {e}") from None
    try:
        target, tokenizer = load_target(pair.target, dtype=dtype, device=device)
    except Exception as e:
        raise DemoError(f"Could not load the target {pair.target!r}: {e}") from e
    try:
        # bound without the feature hooks of assisted generation: they would tax every forward of the plain side
        draft = load_draft(draft_path, target, bind=True)
    except Exception as e:
        raise DemoError(f"Pair {pair.name!r}: could not load the draft {draft_path!r} for its target: {e}") from e
    eos = target.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    loaded = LoadedPair(pair, target, tokenizer, draft, device, eos)
    warm = Settings(max_new_tokens=4)
    hello = [{"role": "user", "content": "Hi"}]
    try:
        for plain, eagle in race(loaded, hello, hello, warm):  # noqa: B007 (the last views are read below)
            pass
    except Exception as e:
        raise DemoError(f"Pair {pair.name!r} loaded but the warm-up generation failed: {type(e).__name__}: {e}") from e
    for view in (plain, eagle):
        if view.state == "error":
            raise DemoError(f"Pair {pair.name!r} loaded but {PANE_TITLES[view.kind].lower()} failed: {view.error}")
    return loaded


class PairCache:
    """Loads model pairs on demand and keeps the last one loaded (one at a time: targets can be large)."""

    def __init__(self, pairs: dict[str, ModelPair], default: str):
        self.pairs = pairs
        self.default = default
        self._loaded: LoadedPair | None = None
        self._errors: dict[str, str] = {}
        self._lock = threading.Lock()
        self._turn = threading.Lock()

    def turn(self) -> threading.Lock:
        """Held for a whole request (``with cache.turn(): ...``): one race at a time on the shared models. A plain
        lock, not an RLock: a generator holding it may be resumed by another worker thread."""
        return self._turn

    def get(self, name: str) -> LoadedPair:
        if name not in self.pairs:
            raise DemoError(f"Unknown model pair {name!r}; choose one of {sorted(self.pairs)}.")
        with self._lock:
            if self._loaded is not None and self._loaded.pair.name == name:
                return self._loaded
            self._loaded = None  # free the previous pair before loading the next one
            try:
                self._loaded = load_pair(self.pairs[name])
            except DemoError as e:
                self._errors[name] = str(e)
                raise
            self._errors.pop(name, None)
            return self._loaded

    def status(self, name: str) -> tuple[str, str]:
        """(kind, message) with kind in ``ready``, ``error``, ``idle``."""
        pair = self.pairs.get(name)
        if pair is None:
            return "error", f"Unknown model pair {name!r}."
        if self._loaded is not None and self._loaded.pair.name == name:
            ld = self._loaded
            return "ready", f"Ready: {pair.title} ({pair.dtype} on {ld.device.type})."
        if name in self._errors:
            return "error", self._errors[name]
        return "idle", f"{pair.title}: loads on the first Generate."


def pair_cache(pairs_file: str | Path | None = None, pair: str | None = None, **overrides) -> PairCache:
    """The demo's pairs: ``pairs_file`` (YAML, see ``load_pairs``) or the embedded pair; ``pair`` is selected when
    the page opens, and ``overrides`` (``target``, ``draft``, ``dtype``, ``device``, ``temperature``; ``None`` = keep)
    change it."""
    pairs, default = load_pairs(pairs_file) if pairs_file else (dict(DEFAULT_PAIRS), EMBEDDED_PAIR)
    default = pair or default
    if default not in pairs:
        raise DemoError(f"--pair {default!r} is not one of {sorted(pairs)}.")
    unknown = set(overrides) - {"target", "draft", "dtype", "device", "temperature"}
    if unknown:
        raise TypeError(f"unknown pair settings {sorted(unknown)}")
    overrides = {k: v for k, v in overrides.items() if v is not None and v != ""}  # temperature 0 is a value
    if overrides:
        changed = replace(pairs[default], **overrides)
        if "draft" in overrides or "target" in overrides:
            changed = replace(changed, label=f"{changed.target} + {changed.draft}")
        pairs[default] = changed
    return PairCache(pairs, default)
