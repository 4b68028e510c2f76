"""``eagle3-hub demo``: the Gradio side-by-side speed demo (library: ``eagle3_hub.demo``), or with
``--export-space DIR`` a Hugging Face Space folder that runs it (library: ``eagle3_hub.space``)."""

from __future__ import annotations

import argparse
import logging
import sys

from ..demo.inputs import Limits


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--pairs", default=None, help="YAML file of model pairs (default: the embedded SmolLM2 pair)")
    parser.add_argument(
        "--pair",
        default=None,
        help="pair selected when the page opens, and the one --target/--draft/--dtype/--device change (default: the file's `default`)",
    )
    parser.add_argument("--target", default=None, help="override the default pair's target (repo id, folder, .gguf)")
    parser.add_argument("--draft", default=None, help="override the default pair's draft (folder or repo id)")
    parser.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="override the default pair's dtype"
    )
    parser.add_argument("--device", default=None, help="override the default pair's device (auto, cpu, cuda, cuda:1, mps)")
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="the page's starting temperature for the default pair (0 = greedy; default: the pair's own, 0.7 for the embedded pair)",
    )
    parser.add_argument(
        "--max-new-tokens-limit", type=int, default=Limits.max_new_tokens, help="largest max-new-tokens a request may ask for"
    )
    parser.add_argument("--queue-size", type=int, default=16, help="requests that may wait in the queue")
    parser.add_argument(
        "--no-preload",
        action="store_true",
        help="load the models on the first request, not at start (a pair that does not load is then shown on the page; at start it stops the demo)",
    )
    parser.add_argument("--host", default=None, help="server address (default 127.0.0.1; 0.0.0.0 to listen on all)")
    parser.add_argument("--port", type=int, default=None, help="server port (default 7860 or the next free one)")
    parser.add_argument("--share", action="store_true", help="create a public gradio.live link")
    g = parser.add_argument_group("Hugging Face Space")
    g.add_argument(
        "--export-space",
        metavar="DIR",
        default=None,
        help="write a self-sufficient Space folder to DIR (app.py, README.md, pairs.yaml, requirements.txt and a "
        "wheel of this package built here) instead of starting the demo; push DIR as the Space. DIR may be "
        "new, or hold anything else (a clone's .git, notes: kept): a file of those names is replaced only "
        "when an earlier export wrote it, unchanged since (space-export.json records them)",
    )
    g.add_argument(
        "--wheel",
        default=None,
        help="with --export-space: bundle this eagle3-hub wheel instead of building one from the source tree",
    )


def make_cache(args):
    from ..demo import pair_cache

    return pair_cache(
        args.pairs,
        args.pair,
        target=args.target,
        draft=args.draft,
        dtype=args.dtype,
        device=args.device,
        temperature=args.temperature,
    )


def run(args) -> int:
    if args.export_space:
        from ..space import export_space

        folder = export_space(args.export_space, pairs=args.pairs, wheel=args.wheel)
        print(
            f"Wrote the Space folder {folder}: push it as a Gradio Space (e.g. `hf upload USER/SPACE {folder} "
            "--repo-type space`)."
        )
        return 0
    from ..demo import CSS, build_app

    if args.max_new_tokens_limit < 1:
        raise ValueError(f"--max-new-tokens-limit must be at least 1, got {args.max_new_tokens_limit}")
    if args.queue_size < 1:
        raise ValueError(f"--queue-size must be at least 1, got {args.queue_size}")
    if args.port is not None and not 0 < args.port < 65536:
        raise ValueError(f"--port must be a TCP port, 1 to 65535, got {args.port}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # gradio's own start-up requests
    logger = logging.getLogger("eagle3_hub.demo")
    cache = make_cache(args)  # a bad pairs file or --pair: DemoError (a ValueError), one line from the CLI
    if not args.no_preload:  # a default pair that does not load stops the demo here (one line, exit 2)
        cache.get(cache.default)
        logger.info("loaded %s", cache.pairs[cache.default].title)
    app = build_app(cache, Limits(max_new_tokens=args.max_new_tokens_limit), queue_size=args.queue_size)
    app.launch(server_name=args.host, server_port=args.port, share=args.share, css=CSS, show_error=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python spaces/app.py [flags]``: the demo command with the same one-line errors as ``eagle3-hub demo``."""
    from ..cli import main as cli_main

    return cli_main(["demo", *(sys.argv[1:] if argv is None else argv)])
