"""``eagle3-hub bench``: decoding methods side by side on question suites (library: ``eagle3_hub.benchmark``).

eagle3-hub bench                                          # embedded SmolLM2, reference draft, bundled MT-bench
eagle3-hub bench --target Qwen/Qwen3-8B --draft user/qwen3-eagle3 --suite mt_bench,humaneval --temperature 0,0.7
"""

from __future__ import annotations

import argparse

from ..benchmark.options import METHOD_NAMES, SWEEP_DEFAULTS, TREE_KEYS, number_list, tree_grid
from ..benchmark.suites import STANDARD_SUITES
from .flags import check_temperature, check_top_k, check_top_p

# --flag -> tree key (the tree's own lookup branch has its flag apart from prompt-lookup decoding's)
TREE_FLAGS = {
    "depth": "depth",
    "tree_top_k": "tree_top_k",
    "total_tokens": "total_tokens",
    "tree_lookup_tokens": "lookup_tokens",
    "min_node_prob": "min_node_prob",
    "grow_min_prob": "grow_min_prob",
}


def add_arguments(parser: argparse.ArgumentParser):
    g = parser.add_argument_group("models")
    g.add_argument("--target", default=None, help="target: Hub id, folder or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument(
        "--draft", default=None, help="EAGLE-3 draft: Hub id or folder (default with the embedded target: the reference draft)"
    )
    g.add_argument(
        "--compare-draft",
        action="append",
        default=[],
        metavar="DRAFT",
        help="another EAGLE-3 draft of the same target (Hub id or folder; repeatable): runs as tree method "
        "tree@NAME beside --draft's, on the same questions in the same run",
    )
    g.add_argument(
        "--assistant-model", default=None, help="also run any small causal LM (Hub id or folder) as a classic assistant"
    )
    g.add_argument(
        "--allow-pickle",
        action="store_true",
        help="also load a target or --assistant-model stored as pickles (pytorch_model.bin); loading a pickle can "
        "run code, so only for files you trust (drafts are safetensors only)",
    )
    g.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: bfloat16 on GPU and on CPUs with bf16 units (AVX512-BF16, AMX), float32 on other CPUs",
    )
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps")
    g = parser.add_argument_group("what to run")
    g.add_argument(
        "--suite",
        default=None,
        help=f"comma-separated: question.jsonl files or folders, names ({', '.join(STANDARD_SUITES)}, all) or Hub dataset ids "
        "(default: mt_bench; continuation, openings of documents, for a target without a chat template)",
    )
    g.add_argument(
        "--bench-dir", default=None, help="folder with <suite>.jsonl or <suite>/question.jsonl files (also $EAGLE3_HUB_BENCH_DIR)"
    )
    g.add_argument("--num-questions", type=int, default=None, help="first N questions of each suite")
    g.add_argument(
        "--methods",
        default="plain,same_forward,lookup,assisted,tree",
        help=f"comma-separated from {', '.join(METHOD_NAMES)} (plain: transformers' generate, always run; "
        "same_forward: plain decoding through the forward and head tree decoding verifies with)",
    )
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument(
        "--ignore-eos",
        action="store_true",
        help="every row generates --max-new-tokens tokens, past its end-of-sequence token (as serving engines' "
        "throughput benchmarks run): in a batch, methods then compare on the same number of tokens",
    )
    g.add_argument("--max-turns", type=int, default=None, help="user turns per question (MT-bench has 2; 1 = first turns only)")
    g.add_argument(
        "--temperature",
        default=None,
        help="comma-separated; 0 = greedy (with the lossless check). E.g. 0,0.7 "
        f"(default: 0; {BASE_MODEL_TEMPERATURES} for a target without a chat template, a base model, which "
        "is mostly sampled)",
    )
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--batch-size",
        default="1",
        help="comma-separated; e.g. 1,4 also runs each suite's questions in left-padded batches of 4 (plain, "
        "same_forward and tree; transformers' assisted and prompt-lookup decoding take one prompt)",
    )
    g.add_argument("--lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens for 'lookup'")
    g.add_argument("--assistant-tokens", type=int, default=None, help="num_assistant_tokens for 'assisted' and 'assistant'")
    g.add_argument("--warmup", type=int, default=1, help="warm-up rounds (every method on the first question) before measuring")
    g = parser.add_argument_group("tree decoding")
    g.add_argument("--depth", default=None, help="draft depth (comma-separated list with --sweep)")
    g.add_argument("--tree-top-k", default=None, help="candidates per node (list with --sweep)")
    g.add_argument("--total-tokens", default=None, help="tree size verified per step (list with --sweep)")
    g.add_argument(
        "--tree-lookup-tokens",
        default=None,
        help="tokens copied from the text so far as one more branch of the tree (default: on for greedy, off when sampling); 0 = none (list with --sweep)",
    )
    g.add_argument(
        "--min-node-prob",
        default=None,
        help="keep only tree nodes whose cumulative draft probability reaches this; 0 = always --total-tokens (list with --sweep)",
    )
    g.add_argument(
        "--grow-min-prob",
        default=None,
        help="draft a further tree level (up to --depth) only while a frontier node's cumulative draft probability "
        "reaches this; 0 = always --depth levels (list with --sweep)",
    )
    g.add_argument(
        "--trees",
        default=None,
        help="tree settings to compare in one run, ';'-separated, each key=value,... over "
        f"{', '.join(TREE_KEYS)} (e.g. 'depth=3;depth=8,grow_min_prob=0.3'); replaces the per-key lists",
    )
    g.add_argument(
        "--profile",
        action="store_true",
        help="print this machine's cost model of tree decoding for the target and draft (verification ms by "
        "rows x slots, draft ms per level; measured once, then read from the cache) and exit; the "
        "adaptive tree chooses its shapes from it",
    )
    g.add_argument(
        "--sweep",
        action="store_true",
        help="try every combination of --depth/--tree-top-k/--total-tokens and report the best for this device",
    )
    g = parser.add_argument_group("output")
    g.add_argument("--out", default="bench-results", help="folder for bench.json, bench.md and bench.png")
    g.add_argument("--no-chart", action="store_true")
    g.add_argument("--save-outputs", action="store_true", help="keep every generated token id in bench.json")
    g.add_argument(
        "--no-float32-check",
        action="store_true",
        help="in bf16/fp16: skip scoring the greedy outputs with a float32 copy of the target (it needs memory for that copy)",
    )
    g.add_argument("--strict", action="store_true", help="exit with status 1 when a greedy output differs from plain greedy")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def tree_grid_from_args(args) -> list[dict]:
    """The tree settings to run: ``--trees`` as listed, else every combination of the per-key lists (a value out of
    its range refused, naming its flag)."""
    from ..benchmark.options import TREE_KEY_TYPES
    from ..generation.tree.config import check_setting

    for flag, key in TREE_FLAGS.items():
        if getattr(args, "trees", None) is None:
            for value in number_list(getattr(args, flag, None), TREE_KEY_TYPES[key]):
                if value is not None:
                    try:
                        check_setting(key, value)
                    except ValueError as e:
                        raise ValueError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: {e}") from None
    return tree_grid(getattr(args, "trees", None), **{key: getattr(args, flag, None) for flag, key in TREE_FLAGS.items()})


def methods_from_args(args) -> list[str]:
    """``--methods`` plus what the other flags imply (``--assistant-model``, ``--trees``, ``--sweep``)."""
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise ValueError(
            f"--methods: give at least one method, comma-separated from {', '.join(METHOD_NAMES)}, got {args.methods!r}"
        )
    unknown = [m for m in methods if m not in METHOD_NAMES]
    if unknown:
        raise ValueError(f"--methods: unknown method(s) {', '.join(map(repr, unknown))}: choose from {', '.join(METHOD_NAMES)}")
    if args.assistant_model and "assistant" not in methods:
        methods.append("assistant")
    if "assistant" in methods and not args.assistant_model:
        raise ValueError("Method 'assistant' runs a small model as a classic assistant: pass --assistant-model ID_OR_FOLDER.")
    if (args.trees or args.sweep) and "tree" not in methods:
        methods.append("tree")
    return methods


BASE_MODEL_TEMPERATURES = "0,0.7,1"


def defaults_for(tokenizer, suite: str | None, temperature: str | None) -> tuple[str, str]:
    """The suite and temperatures a run uses where the command line names none: a chat model answers MT-bench
    greedily; a base model (no chat template) continues openings of documents, greedy and sampled, as it is used."""
    base = not getattr(tokenizer, "chat_template", None)
    return (suite or ("continuation" if base else "mt_bench"), temperature or (BASE_MODEL_TEMPERATURES if base else "0"))


def parse_temperatures(text: str) -> list[float]:
    try:
        temperatures = [float(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--temperature takes comma-separated numbers (0 = greedy), got {text!r}") from None
    if not temperatures:
        raise ValueError(f"--temperature takes numbers >= 0 (0 = greedy), got {text!r}")
    return [check_temperature(t, given=text) for t in temperatures]


def _check_numbers(args):
    for flag in ("max_new_tokens", "num_questions", "max_turns"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    for flag in ("lookup_tokens", "assistant_tokens"):  # tokens proposed per step: a step proposes at least one
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be 0 or more, got {args.warmup}")
    check_top_p(args.top_p)
    check_top_k(args.top_k)


def run(args) -> int:
    from ..benchmark.bench import Mode, run_benchmark
    from ..benchmark.models import compare_draft_names, load_models, resolve_draft
    from ..benchmark.report import print_report, write_report
    from ..benchmark.suites import load_suites
    from ..devices import resolve_device_dtype
    from ..generation.tree import load_draft
    from ..targets import check_model_path

    _check_numbers(args)
    for spec, what in (
        (args.target, "Target"),
        (args.draft, "Draft"),
        (args.assistant_model, "Assistant model"),
        *((p, "Draft to compare") for p in args.compare_draft),
    ):
        check_model_path(spec, what)
    methods = methods_from_args(args)
    if args.compare_draft and "tree" not in methods:
        raise ValueError("--compare-draft runs each draft as a tree method: add tree to --methods")
    if args.sweep and not args.trees:
        for key, default in SWEEP_DEFAULTS.items():
            if getattr(args, key) is None:
                setattr(args, key, default)
    if args.temperature is not None:  # a bad value fails before any model loads
        parse_temperatures(args.temperature)
    batch_sizes = number_list(args.batch_size)
    if any(b < 1 for b in batch_sizes):
        raise ValueError(f"--batch-size takes integers >= 1, got {args.batch_size!r}")
    grid = tree_grid_from_args(args) if "tree" in methods else None
    draft_path = resolve_draft(args.draft, args.target, methods)
    if args.suite is not None:  # a bad suite fails before any model loads
        suites = load_suites(args.suite, bench_dir=args.bench_dir, num_questions=args.num_questions)
    device, dtype = resolve_device_dtype(args.device, args.dtype)
    target, tokenizer, draft, assistant, assistant_tok = load_models(
        args.target,
        draft_path,
        device,
        dtype,
        assistant_model=args.assistant_model,
        assistant_tokens=args.assistant_tokens,
        allow_pickle=args.allow_pickle,
    )
    suite, temperature = defaults_for(tokenizer, args.suite, args.temperature)
    if args.suite is None:
        suites = load_suites(suite, bench_dir=args.bench_dir, num_questions=args.num_questions)
    modes = [Mode(t, args.top_p, args.top_k) for t in parse_temperatures(temperature)]
    if args.profile:
        if draft is None:
            raise ValueError("--profile measures tree decoding: it needs a draft (--draft, or the embedded target's)")
        from ..generation.tree.costs import profile

        print(profile(target, draft, rows=max(batch_sizes)).table())
        return 0
    compared = {name: load_draft(path, target, assist=True) for name, path in compare_draft_names(args.compare_draft).items()}
    results = run_benchmark(
        target,
        tokenizer,
        suites,
        methods=methods,
        draft=draft,
        assistant=assistant,
        assistant_tokenizer=assistant_tok,
        modes=modes,
        max_new_tokens=args.max_new_tokens,
        max_turns=args.max_turns,
        tree_grid=grid,
        lookup_tokens=args.lookup_tokens,
        warmup=args.warmup,
        seed=args.seed,
        progress=not args.quiet,
        keep_outputs=args.save_outputs,
        float32_check=not args.no_float32_check,
        ignore_eos=args.ignore_eos,
        batch_sizes=batch_sizes,
        compare_drafts=compared,
    )
    results["settings"].update(
        target=args.target or "smollm2-135m-instruct",
        draft=draft_path,
        compare_drafts=compare_draft_names(args.compare_draft),
        assistant_model=args.assistant_model,
    )
    paths = write_report(results, args.out, chart=not args.no_chart)
    print_report(results, paths)
    failed = any(not e["lossless"] for e in results["lossless"].values())
    return 1 if (failed and args.strict) else 0
