"""EAGLE-3 dynamic-tree speculative decoding for a transformers causal LM and an EAGLE-3 draft.

One step, per row: the draft builds a tree of likely continuations of the row's latest token (``drafting``); one
target forward verifies all of its nodes under a tree attention mask (``verification``); the longest path the
target agrees with is kept, plus the target's own next token (``acceptance``: greedy, or lossless multi-candidate
sampling); the target cache keeps the accepted slots (``caches``). Greedy decoding adds a branch copied from the
row's own text (``lookup``). ``decode`` is the loop; ``api`` the entry points; ``hub_entry`` the file transformers
runs for ``custom_generate="user/draft-repo"``.

The modules import only torch, transformers, the standard library and each other (``hub_files`` aside): they are
copied verbatim into a draft folder's ``custom_generate/``.
"""

from .api import attention_kernels, check_draft_fits_target, generate, load_draft, tree_generate
from .caches import TreeKVCache
from .config import BATCH_TREE_DEFAULTS, TREE_DEFAULTS, TreeConfig, tree_defaults
from .hub_files import custom_generate_files, write_custom_generate
from .lookup import LOOKUP_SHARE
from .outputs import TreeDecodingOutput, TreeDecodingStats

__all__ = [
    "LOOKUP_SHARE",
    "TREE_DEFAULTS",
    "TreeConfig",
    "TreeDecodingOutput",
    "TreeDecodingStats",
    "TreeKVCache",
    "attention_kernels",
    "check_draft_fits_target",
    "custom_generate_files",
    "generate",
    "load_draft",
    "tree_defaults",
    "BATCH_TREE_DEFAULTS",
    "tree_generate",
    "write_custom_generate",
]
