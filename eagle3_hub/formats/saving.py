"""Save hooks of ``Eagle3DraftModel.save_pretrained`` (our layout): refusals before writing, then the engine keys,
the remote-code files and ``custom_generate/`` next to the weights."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..atomic import atomic_copy, atomic_path, atomic_write_json
from ..configuration_eagle3 import Eagle3Config
from .aux_layers import to_vllm_aux_layer_ids
from .files import read_config_dict, safetensors_files
from .layouts import ENGINE_ARCHITECTURE, VARIANT_FLAGS

CODE_FILES = ("configuration_eagle3.py", "modeling_eagle3.py", "eagle3_assistant.py")
AUTO_MAP = {
    "AutoConfig": "configuration_eagle3.Eagle3Config",
    "AutoModel": "modeling_eagle3.Eagle3DraftModel",
    "AutoModelForCausalLM": "modeling_eagle3.Eagle3DraftModel",
}


def check_savable(config: Eagle3Config, d2t: torch.Tensor | None = None, t2d: torch.Tensor | None = None):
    ids = config.aux_layer_ids
    if ids is None or len(ids) != 3:
        raise ValueError(
            f"This draft's eagle_config lists aux layers {ids}; an EAGLE-3 draft needs exactly 3 target layers "
            "(set draft.config.aux_layer_ids = [low, mid, high], 0-based layer outputs)."
        )
    if config.target_num_hidden_layers is not None and any(not 0 <= i < config.target_num_hidden_layers for i in ids):
        raise ValueError(
            f"aux layers {ids} are out of range for the {config.target_num_hidden_layers}-layer target this draft "
            f"was sized for (0-based layer outputs in 0..{config.target_num_hidden_layers - 1})."
        )
    if d2t is not None:
        target_ids = d2t.cpu() + torch.arange(d2t.numel())
        if target_ids.min() < 0 or target_ids.max() >= config.vocab_size:
            raise ValueError("d2t maps draft ids outside the target vocabulary: call draft.set_vocab_mapping(target_ids).")
        if t2d is not None and not torch.equal(t2d.cpu().nonzero().flatten(), target_ids.sort().values):
            raise ValueError("t2d and d2t describe different draft vocabularies: call draft.set_vocab_mapping(target_ids).")


def identity_vocabulary(model) -> bool:
    """Full-vocabulary draft with the identity map: its folders ship no d2t/t2d (vLLM has no parameter for them
    then and fails on a shipped d2t; SGLang and we read their absence as the identity)."""
    return model.config.draft_vocab_size == model.config.vocab_size and not bool(model.d2t.cpu().any())


def prepare_save(model):
    """Before ``save_pretrained`` writes: refuse drafts that would be saved broken, set the remote-code map."""
    check_savable(model.config, model.d2t, model.t2d)
    model.config.auto_map = dict(AUTO_MAP)


def engine_keys(config: Eagle3Config) -> dict:
    """The top-level keys the engines read that our config class does not spell itself."""
    keys = {"architectures": [ENGINE_ARCHITECTURE], "aux_layer_convention": "output"}
    keys.update({flag: bool(getattr(config, flag)) for flag in VARIANT_FLAGS})
    if config.aux_layer_ids is not None:
        keys["eagle_aux_hidden_state_layer_ids"] = to_vllm_aux_layer_ids(config.aux_layer_ids)  # vLLM: inputs
    return keys


def finish_save(model, save_directory):
    """After ``save_pretrained``: engine keys and ``auto_map`` in config.json, no d2t/t2d for a full identity
    vocabulary, the code files next to the weights so that ``AutoModel.from_pretrained(path, trust_remote_code=True)``
    works without eagle3_hub, and ``custom_generate/generate.py`` so that ``target.generate(ids,
    custom_generate=path, trust_remote_code=True)`` runs tree decoding without it."""
    folder = Path(save_directory)
    config = read_config_dict(folder)
    config.update(engine_keys(model.config))
    config["auto_map"] = dict(AUTO_MAP)
    atomic_write_json(folder / "config.json", config, indent=2)
    if identity_vocabulary(model):
        _drop_tensors(folder, ("d2t", "t2d"))
    package = Path(__file__).parent.parent  # eagle3_hub/, where the code files live
    for name in CODE_FILES:
        atomic_copy(package / name, folder / name)
    # tree decoding through transformers without the package: target.generate(custom_generate=<this repo>)
    from ..generation.tree import write_custom_generate

    write_custom_generate(folder)


def _drop_tensors(folder: Path, names: tuple[str, ...]):
    from safetensors.torch import load_file

    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt") as f:
            if not set(names) & set(f.keys()):
                continue
            metadata = f.metadata()
        state = {k: v for k, v in load_file(str(file)).items() if k not in names}
        with atomic_path(file, suffix=".safetensors") as tmp:
            save_file(state, str(tmp), metadata=metadata)
