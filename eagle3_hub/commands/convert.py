"""`eagle3-hub convert`: rewrite a draft from any layout into ours or the layout vLLM / SGLang serve."""

from __future__ import annotations

import argparse

# formats.EXPORTS, spelt out so that `eagle3-hub convert --help` imports no torch (tests/test_structure.py checks them)
EXPORTS = ("ours", "vllm", "sglang")


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,15,28, got {text!r}") from e


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("src", help="draft to convert: folder or Hub repo id (ours, EAGLE-3 release, SpecForge, speculators)")
    parser.add_argument("dst", help="output folder (must not exist or be empty, unless --force)")
    parser.add_argument(
        "--to",
        choices=EXPORTS,
        default="ours",
        help="ours: transformers layout with code files (default); sglang: model_type llama folder served by SGLang "
        "(and by vLLM with method eagle3); vllm: speculators layout (`vllm serve DST`)",
    )
    parser.add_argument("--target", help="target model (Hub id or folder; only its config is read) to check the draft against")
    parser.add_argument(
        "--aux-layer-ids", type=_int_list, help="override the aux layers: LOW,MID,HIGH, 0-based target layer outputs"
    )
    parser.add_argument(
        "--aux-layer-convention",
        choices=("output", "input"),
        help="how to read the aux layer ids SRC's config lists, for drafts whose config does not say: 'output' (id i = "
        "the output of decoder layer i: SGLang's Llama path, SpecForge) or 'input' (the input of layer i: vLLM)",
    )
    parser.add_argument("--verifier", help="--to vllm: target repo id written into speculators_config (default: --target)")
    parser.add_argument(
        "--num-speculative-tokens", type=int, default=3, help="--to vllm: speculative_tokens of the proposal method"
    )
    parser.add_argument("--force", action="store_true", help="replace a non-empty DST")


def run(args) -> int:
    from ..formats import convert

    if args.num_speculative_tokens < 1:
        raise ValueError(f"--num-speculative-tokens must be at least 1, got {args.num_speculative_tokens}")
    out = convert(
        args.src,
        args.dst,
        to=args.to,
        target=args.target,
        aux_layer_ids=args.aux_layer_ids,
        verifier=args.verifier,
        num_speculative_tokens=args.num_speculative_tokens,
        force=args.force,
        aux_layer_convention=args.aux_layer_convention,
    )
    print(f"wrote {args.to} layout to {out}")
    return 0
