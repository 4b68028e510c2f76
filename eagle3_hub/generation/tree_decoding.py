"""The former home of tree decoding, kept for the modules and users that import from it: everything lives in
``eagle3_hub.generation.tree`` now."""

from .tree import (
    LOOKUP_SHARE,
    TREE_DEFAULTS,
    TreeConfig,
    TreeDecodingOutput,
    TreeDecodingStats,
    TreeKVCache,
    attention_kernels,
    check_draft_fits_target,
    generate,
    tree_defaults,
    tree_generate,
    write_custom_generate,
)

__all__ = [
    "LOOKUP_SHARE",
    "TREE_DEFAULTS",
    "TreeConfig",
    "TreeDecodingOutput",
    "TreeDecodingStats",
    "TreeKVCache",
    "attention_kernels",
    "check_draft_fits_target",
    "generate",
    "tree_defaults",
    "tree_generate",
    "write_custom_generate",
]
