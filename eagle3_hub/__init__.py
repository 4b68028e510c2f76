"""eagle3-hub: EAGLE-3 speculative decoding for the Hugging Face stack."""

from transformers import AutoConfig, AutoModel

from . import formats  # noqa: F401  (registers the published layouts' load and save hooks with the model)
from .configuration_eagle3 import Eagle3Config, default_aux_layer_ids
from .generation.tree import TreeConfig, TreeDecodingOutput, TreeDecodingStats, generate, tree_generate
from .modeling_eagle3 import Eagle3DraftModel, Eagle3DraftOutput
from .targets import load_target, reference_draft

AutoConfig.register(Eagle3Config.model_type, Eagle3Config, exist_ok=True)
AutoModel.register(Eagle3Config, Eagle3DraftModel, exist_ok=True)

__version__ = "0.1.0"
__all__ = [
    "Eagle3Config",
    "Eagle3DraftModel",
    "Eagle3DraftOutput",
    "TreeConfig",
    "TreeDecodingOutput",
    "TreeDecodingStats",
    "default_aux_layer_ids",
    "generate",
    "load_target",
    "reference_draft",
    "tree_generate",
]
