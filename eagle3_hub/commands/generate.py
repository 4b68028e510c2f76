"""``eagle3-hub generate``: stream text from a target with EAGLE-3 tree decoding.

eagle3-hub generate --prompt "Why is the sky blue?"                 # embedded SmolLM2 + reference draft
eagle3-hub generate --prompt "..." --target Qwen/Qwen3-0.6B --draft user/qwen3-eagle3 --temperature 0.7
"""

from __future__ import annotations

import argparse
import sys

from .flags import check_temperature, check_top_k, check_top_p


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument(
        "--prompt",
        required=True,
        help="the user message (or raw text with --no-chat-template)",
    )
    parser.add_argument(
        "--target",
        default=None,
        help="target model: Hub id, folder or .gguf (default: embedded SmolLM2-135M-Instruct)",
    )
    parser.add_argument(
        "--draft",
        default=None,
        help="EAGLE-3 draft: Hub id or folder (default with the embedded target: its reference draft, shipped in "
        "eagle3_hub/reference_draft/)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 = greedy (default); > 0 samples",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        default=0,
        help="sampling: keep the k most likely tokens (0 = off)",
    )
    parser.add_argument("--top-p", type=float, default=1.0, help="sampling: nucleus mass (1.0 = off)")
    parser.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    parser.add_argument(
        "--depth",
        type=int,
        default=None,
        help="tree depth (default: per device, see TREE_DEFAULTS)",
    )
    parser.add_argument("--tree-top-k", type=int, default=None, help="children per expanded tree node")
    parser.add_argument(
        "--total-tokens",
        type=int,
        default=None,
        help="tree nodes verified per target forward",
    )
    parser.add_argument(
        "--lookup-tokens",
        type=int,
        default=None,
        help="greedy: tokens copied from the text so far after a 3-token match (fewer after shorter ones), verified "
        "as one more branch (0 = none; default: per device)",
    )
    parser.add_argument(
        "--min-node-prob",
        type=float,
        default=None,
        help="keep only tree nodes whose cumulative draft probability reaches this (0 = always --total-tokens; "
        "default: per device)",
    )
    parser.add_argument(
        "--grow-min-prob",
        type=float,
        default=None,
        help="draft a further tree level (up to --depth) only while a frontier node's cumulative draft probability "
        "reaches this (0 = always --depth levels; default: per device)",
    )
    parser.add_argument(
        "--draft-sampling",
        choices=["on", "off"],
        default=None,
        help="sampling: draw each tree node's children from the draft's distribution (on, the default) or take its "
        "most probable tokens (off); both keep the target's distribution",
    )
    parser.add_argument(
        "--draft-int8",
        action="store_true",
        help="CPU, float32 draft: run the draft's products on int8 weights (a quarter of the bytes; the output is "
        "unchanged, the target verifies every token)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="auto: bfloat16 on GPU and on CPUs with bf16 units (AVX512-BF16, AMX); float32 on other CPUs, where bf16 "
        "matmuls of several rows are far slower. Greedy output equals plain greedy token for token in float32; in bf16 "
        "the two can part at a near-tie",
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA, else Apple MPS, else CPU), cpu, cuda, cuda:1, mps")
    parser.add_argument("--seed", type=int, default=None, help="seed for sampling")
    parser.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    parser.add_argument(
        "--stats",
        action="store_true",
        help="print speed and acceptance statistics to stderr",
    )


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import TextStreamer

    from ..devices import resolve_device_dtype
    from ..generation.tree import generate, load_draft
    from ..targets import check_model_path, default_draft, load_target

    check_model_path(args.target, "Target")
    check_model_path(args.draft, "Draft")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    check_temperature(args.temperature)  # the rules bench applies (commands/flags.py)
    check_top_p(args.top_p)
    check_top_k(args.top_k)
    draft_path = args.draft or default_draft(args.target, "eagle3-hub generate")
    device, dtype = resolve_device_dtype(args.device, args.dtype)
    target, tokenizer = load_target(args.target, dtype=dtype, device=device)
    draft = load_draft(draft_path, target, bind=True)

    if not args.no_chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": args.prompt}],
            tokenize=False,
            add_generation_prompt=True,
        )
        enc = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    else:
        enc = tokenizer(args.prompt, return_tensors="pt")
    generator = None
    if args.seed is not None:
        generator = torch.Generator(device=device).manual_seed(args.seed)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    do_sample = args.temperature > 0
    out = generate(
        target,
        draft,
        enc["input_ids"].to(device),
        attention_mask=enc["attention_mask"].to(device),
        max_new_tokens=args.max_new_tokens,
        do_sample=do_sample,
        temperature=args.temperature if do_sample else 1.0,
        top_k=args.top_k,
        top_p=args.top_p,
        stop_strings=args.stop,
        tokenizer=tokenizer,
        streamer=streamer,
        depth=args.depth,
        tree_top_k=args.tree_top_k,
        total_tokens=args.total_tokens,
        lookup_tokens=args.lookup_tokens,
        min_node_prob=args.min_node_prob,
        grow_min_prob=args.grow_min_prob,
        draft_sampling=None if args.draft_sampling is None else args.draft_sampling == "on",
        draft_int8=args.draft_int8 or None,
        generator=generator,
    )
    if args.stats:
        print(str(out.stats), file=sys.stderr)
    return 0
