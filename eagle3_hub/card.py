"""``eagle3-hub card``: the model card (README.md) of a draft, written with ``huggingface_hub.ModelCard``.

Metadata: ``base_model`` (the target), ``library_name``, ``pipeline_tag``, tags, training datasets and the
target's license. Body: what the draft is, its training data and recipe (``training_info``), the benchmark
table (a ``bench.json`` of ``eagle3-hub bench``, with the machine it ran on, and its chart) and copy-paste usage
for transformers, vLLM and SGLang.

Inputs found in the draft folder when not passed: ``training_metrics.json`` (written by ``eagle3-hub train``)
or ``training_info.json``, and ``bench.json`` / ``bench.png``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .atomic import atomic_copy, atomic_path, atomic_write_text
from .target_terms import HUB_ID_PATTERN, target_hub_id, target_license
from .targets import named_target

logger = logging.getLogger(__name__)

CARD_MARKER = "<!-- model card written by eagle3-hub; `eagle3-hub card` rewrites it -->"
TAGS = ["eagle3", "speculative-decoding", "draft-model", "eagle3-hub"]
ENGINE_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
# in the usage snippets when the card does not know the repository (`eagle3-hub card --repo-id`, `push` set it)
REPO_PLACEHOLDER = "YOUR_NAME/YOUR_DRAFT_REPO"
TARGET_PLACEHOLDER = "TARGET_MODEL"  # a target that is a local path


# ----------------------------------------------------------------------------------------- the target
# ----------------------------------------------------------------------------------------- the draft
def count_parameters(folder: Path) -> tuple[int | None, bool]:
    """(parameters stored in the folder's safetensors files, read from their headers, without the token
    embedding and the vocabulary maps; whether the embedding is stored)."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None, False
    n, has_embedding = 0, False
    for f in files:
        with safe_open(str(f), "pt") as st:
            for key in st.keys():
                if key.endswith("embed_tokens.weight"):
                    has_embedding = True
                    continue
                if key.split(".")[-1] in ("d2t", "t2d"):
                    continue
                count = 1
                for dim in st.get_slice(key).get_shape():
                    count *= dim
                n += count
    return n, has_embedding


def _human(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def check_repo_id(repo_id: str, what: str = "repo id") -> str:
    """``repo_id`` (``name`` or ``owner/name``) as the Hub accepts it (huggingface_hub's own rule), or a ValueError
    naming it: a newline or a quote must never reach a card's YAML header or a push."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise ValueError(
            f"{what} {repo_id!r} is not a Hub repository id ({str(e).splitlines()[0]}): give `name` or "
            "`owner/name`, letters, digits, '-', '_' and '.'."
        ) from None
    return repo_id


def card_is_ours(readme: str | Path) -> bool:
    try:
        return CARD_MARKER in Path(readme).read_text(encoding="utf-8")
    except OSError:
        return False


def engine_native(config: dict) -> bool:
    """Whether vLLM / SGLang read this config.json as it is (SpecForge / speculators layouts)."""
    archs = config.get("architectures") or []
    return any(a in ENGINE_ARCHITECTURES for a in archs) or "speculators_config" in config


# ----------------------------------------------------------------------------------------- sections
def _bench_section(bench: dict, chart: str | None, target: str, repo: str) -> str:
    from .benchmark.machine import describe_machine
    from .benchmark.report import acceptance_text, loop_text, lossless_text, row_sort_key

    # every mode the run measured (a base model's greedy text loops: its sampled rows are the ones users get)
    rows = [r for r in bench["results"] if not r["method"].startswith("oracle")] or bench["results"]
    rows = [r for r in rows if "@" not in r["method"]]  # `--compare-draft` rows (`tree@NAME`) are another draft's
    batch = min(r.get("batch", 1) for r in rows)
    rows = [r for r in rows if r.get("batch", 1) == batch]
    suites = {r["suite"] for r in rows}
    if len(suites) == 2:
        rows = [r for r in rows if r["suite"] != "_all"]
    rows.sort(key=row_sort_key)
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    lossless = bench.get("lossless", {})
    with_same = any(r.get("speedup_same_forward") is not None for r in rows)  # the run had the second baseline
    with_loops = any(r.get("loop_share") is not None for r in rows)
    lines = [
        "| Suite | "
        + ("Mode | " if len(modes) > 1 else "")
        + "Method | Tokens/s | Speed-up"
        + (" | vs same forward" if with_same else "")
        + " | Mean acceptance length | Accepted at draft position 1/2/3 | Same output as plain greedy"
        + (" | Loop share" if with_loops else "")
        + " |",
        "|---|---|---|---|---|---|---|"
        + ("---|" if with_same else "")
        + ("---|" if len(modes) > 1 else "")
        + ("---|" if with_loops else ""),
    ]
    for r in rows:
        e = lossless.get(r["method"])
        same = "–" if r["method"] == "plain" or e is None or r["mode"] != "greedy" else lossless_text(e, r["suite"])
        speed = "–" if r["speedup"] is None else f"{r['speedup']:.2f}×"
        if with_same:
            alone = r.get("speedup_same_forward")
            speed += " | " + ("–" if alone is None else f"{alone:.2f}×")
        tps = "–" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.1f}"
        tau = "–" if r["mean_acceptance_length"] is None else f"{r['mean_acceptance_length']:.2f}"
        suite = "all suites" if r["suite"] == "_all" else r["suite"]
        mode_cell = f"{r['mode']} | " if len(modes) > 1 else ""
        loops = f" | {loop_text(r.get('loop_share'))}" if with_loops else ""
        lines.append(
            f"| {suite} | {mode_cell}{r['method']} | {tps} | {speed} | {tau} | "
            f"{acceptance_text(r['acceptance_by_position'], 3)} | {same}{loops} |"
        )
    s = bench["settings"]
    suites_text = ", ".join(f"{x['name']} ({x['questions']} questions)" for x in s["suites"])
    mode = " and ".join(modes) if modes else "greedy"
    out = [
        "## Benchmark",
        "",
        f"Measured with `eagle3-hub bench` on **{describe_machine(bench['machine'])}** ({bench.get('created', '')[:10]}): "
        f"{suites_text}, batch size {batch}, {mode} decoding, at most {s['max_new_tokens']} new tokens per turn. Speed-up is "
        "over plain `target.generate` in the same run (methods interleaved per question). *plain*: no speculation; "
        "*lookup*: transformers prompt-lookup decoding; *assisted*: this draft as `assistant_model`; *tree*: EAGLE-3 "
        "tree decoding; *vs same forward*: speed-up over plain decoding through the target forward tree decoding "
        "verifies with (*same_forward*), what speculation alone buys. Mean acceptance length = tokens committed per "
        "target forward."
        + (
            " Loop share: the share of each output's 8-grams that repeat an earlier one; LOOPS marks rows whose "
            "outputs loop, where a speed-up measures copying the loop, not drafting."
            if with_loops
            else ""
        ),
        "",
        *lines,
        "",
    ]
    if s.get("tree") and len(s["tree"]) == 1 and s["tree"][0]:
        out += [f"Tree settings: {', '.join(f'`{k}={v}`' for k, v in s['tree'][0].items())}.", ""]
    for m, sweep in (bench.get("sweep") or {}).items():
        if sweep.get("best"):
            best = {k: v for k, v in sweep["best"].items() if k != "speedup"}
            out += [
                f"Best tree setting on this machine ({m}): {', '.join(f'`{k}={v}`' for k, v in best.items())} "
                f"({sweep['best']['speedup']:.2f}×).",
                "",
            ]
    if any(e.get("near_ties") for e in lossless.values()):
        out += [
            f"In {bench['machine'].get('dtype')}, verifying several tokens at once rounds differently from one-token "
            "decoding, so outputs can part from plain greedy at a near-tie. Every greedy output of this run, plain's "
            "included, was scored by a float32 copy of the target: *yes, up to near-ties* means each emitted token "
            "was within rounding of the float32 target's best, or of the target's own best in its dtype on the same "
            "text (the largest float32 gaps are given). In float32 the outputs are token for token plain "
            "greedy's.",
            "",
        ]
    if chart:
        out += [f"![Speed-up and acceptance by draft position]({chart})", ""]
    out += [
        "Speed-ups depend on the hardware, the dtype and the prompts; measure yours with "
        f"`eagle3-hub bench --target {target} --draft {repo}`.",
        "",
    ]
    return "\n".join(out)


def _training_section(info: dict) -> str:
    if not info:
        return ""
    out = ["## Training", ""]
    data = info.get("datasets") or info.get("dataset")
    if data:
        items = data if isinstance(data, list) else [data]
        names = [d if isinstance(d, str) else d.get("name") or d.get("path") or json.dumps(d) for d in items]
        out.append(
            "Data: "
            + ", ".join(
                f"[{n}](https://huggingface.co/datasets/{n})"
                if HUB_ID_PATTERN.fullmatch(n) and not Path(n).exists()
                else f"`{n}`"
                for n in names
            )
            + "."
        )
        if info.get("regenerated") or info.get("regenerate"):
            out.append("The responses were regenerated by the target, so that the draft learns the target's own distribution.")
        out.append("")
    skip = {"datasets", "dataset", "target", "regenerated", "regenerate"}
    recipe = {k: v for k, v in info.items() if k not in skip and v is not None}
    if recipe:
        out += ["| Setting | Value |", "|---|---|"]
        for k, v in recipe.items():
            value = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
            out.append(f"| {k} | {value} |")
        out.append("")
    return "\n".join(out)


def _usage_section(repo: str, target: str, config: dict, tree_params: dict | None, prompt_only: bool = False) -> str:
    tree = tree_params or {}
    depth, topk, total = tree.get("depth"), tree.get("tree_top_k"), tree.get("total_tokens")
    tree_args = "".join(
        f", {k}={tree[k]}"
        for k in ("depth", "tree_top_k", "total_tokens", "lookup_tokens", "min_node_prob", "grow_min_prob")
        if tree.get(k) is not None
    )
    out = [
        "## Usage",
        "",
        "### transformers",
        "",
        "```bash\npip install eagle3-hub\n```",
        "",
        "```python",
        "import torch",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "from eagle3_hub import Eagle3DraftModel",
        "",
        f'tokenizer = AutoTokenizer.from_pretrained("{target}")',
        f'target = AutoModelForCausalLM.from_pretrained("{target}", dtype=torch.bfloat16, device_map="auto")',
        f'draft = Eagle3DraftModel.from_pretrained("{repo}", dtype=torch.bfloat16).to(target.device)',
        "draft.bind(target)  # shares the target's embedding, hooks its feature layers",
        "",
        *(
            [
                "# a base model, prompted as the draft was trained: the text, then a newline",
                'inputs = tokenizer("Speculative decoding makes a language model faster by\\n", return_tensors="pt").to(target.device)',
            ]
            if prompt_only
            else [
                'messages = [{"role": "user", "content": "Explain speculative decoding in two sentences."}]',
                'inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True).to(target.device)',
            ]
        ),
        "",
        "# 1) as a transformers assistant: same output as target.generate, fewer target forwards",
        "out = target.generate(**inputs, assistant_model=draft, max_new_tokens=256)",
        'print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "",
        "# 2) EAGLE-3 tree decoding: several candidate continuations verified in one target forward",
        "from eagle3_hub import generate",
        "",
        f'out = generate(target, draft, inputs["input_ids"], max_new_tokens=256, tokenizer=tokenizer{tree_args})',
        'print(tokenizer.decode(out.sequences[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "```",
        "",
        "From the command line:",
        "",
        "```bash",
        f'eagle3-hub generate --target {target} --draft {repo} --prompt "Explain speculative decoding." --stats',
        "```",
        "",
    ]
    if config.get("auto_map"):
        out += [
            "Without installing eagle3-hub, the code files in this repository load the draft (`trust_remote_code`):",
            "",
            "```python",
            "from transformers import AutoModel",
            "",
            f'draft = AutoModel.from_pretrained("{repo}", trust_remote_code=True, dtype=torch.bfloat16).to(target.device)',
            "draft.bind(target)",
            "out = target.generate(**inputs, assistant_model=draft, max_new_tokens=256)",
            "```",
            "",
        ]
    native = engine_native(config)
    engine_repo = repo if native else "./draft-engine"
    convert = (
        []
        if native
        else [
            "This repository uses the eagle3-hub layout; export the layout the engines read first:",
            "",
            "```bash",
            f"eagle3-hub convert {repo} ./draft-engine --to vllm",
            "```",
            "",
        ]
    )
    # engines draft every level: a tree grown by grow_min_prob has its depth as a cap, not as what it drafts
    steps, sglang_steps = depth or 3, depth or 5
    if tree.get("grow_min_prob"):
        steps = sglang_steps = min(steps, 3)
    out += [
        "### vLLM",
        "",
        *convert,
        "```bash",
        f"vllm serve {target} \\",
        f'  --speculative-config \'{{"method": "eagle3", "model": "{engine_repo}", "num_speculative_tokens": {steps}}}\'',
        "```",
        "",
        "### SGLang",
        "",
        "```bash",
        f"python -m sglang.launch_server --model-path {target} \\",
        f"  --speculative-algorithm EAGLE3 --speculative-draft-model-path {engine_repo} \\",
        f"  --speculative-num-steps {sglang_steps} --speculative-eagle-topk {topk or 8} "
        f"--speculative-num-draft-tokens {total or 32}",
        "```",
        "",
    ]
    return "\n".join(out)


def _architecture(config: dict) -> str:
    n = int(config.get("num_hidden_layers") or 1)
    text = "one Llama-style decoder layer over [token embedding ; fused target features]"
    if n > 1:
        text += f", then {n - 1} further Llama decoder layer{'s' if n > 2 else ''}"
    types = config.get("layer_types") or []
    if "sliding_attention" in types:
        text += f"; sliding-window attention ({config.get('sliding_window')} positions) in layers " + ", ".join(
            str(i) for i, t in enumerate(types) if t == "sliding_attention"
        )
    return text


def _what_section(name: str, target_text: str, config: dict, params: tuple[int | None, bool]) -> str:
    aux = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    vocab, dvocab = config.get("vocab_size"), config.get("draft_vocab_size")
    layers = config.get("target_num_hidden_layers")
    lines = [
        f"# {name}",
        "",
        f"An [EAGLE-3](https://arxiv.org/abs/2503.01840) draft model for {target_text}. It speeds up the target's "
        "generation by speculative decoding: the draft proposes several tokens (a tree of candidates) from the "
        "target's own hidden states, and the target checks them all in one forward pass, so greedy outputs are the "
        "target's own.",
        "",
        "| | |",
        "|---|---|",
        f"| Architecture | {_architecture(config)} |",
        f"| Parameters | {_human(params[0])} without the token embedding "
        f"({'stored here as well' if params[1] else 'taken from the target at load time'}) |",
        f"| Hidden size | {config.get('hidden_size')} |",
        f"| Target features | outputs of decoder layers {aux} (0-based) of {layers or '?'}, concatenated and fused by `fc` |",
        f"| Vocabulary | draft {dvocab} tokens mapped to the target's {vocab} (`d2t`, `t2d`) |",
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- the card
def _load_json(obj) -> dict | None:
    if obj is None or isinstance(obj, dict):
        return obj
    path = Path(obj)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: pass a JSON file (a bench.json of `eagle3-hub bench`, the "
            "training_metrics.json of `eagle3-hub train`)"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}): pass the file that eagle3-hub wrote") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object: pass the file that eagle3-hub wrote")
    return data


def _write_derivative_terms(folder: Path, target) -> None:
    """The files a model derived from ``target`` (a ``NamedTarget``) must carry: its NOTICE and a copy of its terms,
    from the target's package (which must be installed: it is also what trained the draft)."""
    import importlib.util

    atomic_write_text(folder / "NOTICE", target.notice + "\n")
    spec = importlib.util.find_spec(target.package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"The card of a draft for {target.hub_id} must ship a copy of its terms, which come with "
            f"its package: {target.pip_command}"
        )
    terms = Path(spec.origin).parent / target.terms_file
    atomic_copy(terms, folder / Path(target.terms_file).name)


def write_model_card(
    draft_dir: str | Path,
    bench_json: str | Path | dict | None = None,
    training_info: str | Path | dict | None = None,
    base_model: str | None = None,
    repo_id: str | None = None,
    license: str | None = None,
    datasets: list[str] | None = None,
    chart: str | Path | None = None,
    force: bool = False,
) -> Path:
    """Write ``draft_dir/README.md`` and return its path.

    bench_json: a ``bench.json`` of ``eagle3-hub bench`` (path or dict); default ``draft_dir/bench.json``. Its
        file and the chart next to it (``bench.png``) are copied into the folder so that they are uploaded.
    training_info: dict (or JSON file) of the training run: ``target``, ``datasets``, ``regenerated`` and any
        recipe settings (shown as a table); default: ``draft_dir/training_info.json``. The ``training_metrics.json``
        of ``eagle3-hub train`` is read as such by ``eagle3_hub.publish`` (``eagle3-hub card`` / ``push`` use it).
    base_model: the target (Hub id, folder or ``smollm2-135m-instruct``); default from training_info, then the
        bench settings, then an earlier eagle3-hub card.
    repo_id: where the draft will live, for the usage snippets (default: the folder path).
    license: default: the target's license.
    force: replace a README.md that eagle3-hub did not write (without it, such a file is refused).
    """
    from huggingface_hub import ModelCard, ModelCardData

    if repo_id is not None:
        check_repo_id(repo_id, "--repo-id")

    folder = Path(draft_dir)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json: pass the folder of a saved draft")
    config = _load_json(config_path)
    readme = folder / "README.md"
    if (readme.exists() or readme.is_symlink()) and not card_is_ours(readme) and not force:
        raise FileExistsError(
            f"{readme} was not written by eagle3-hub (it lacks the card's marker): the card never "
            "replaces it unless asked. Move it away, or pass --force (force=True) to replace it."
        )
    previous = ModelCard.load(readme, ignore_metadata_errors=True).data.to_dict() if card_is_ours(readme) else {}
    if previous.get("eagle3_hub_repo") is not None:
        try:
            check_repo_id(str(previous["eagle3_hub_repo"]))
        except ValueError:  # an edited header: the repository is asked for again, not carried on
            previous.pop("eagle3_hub_repo")

    if training_info is None and (folder / "training_info.json").is_file():
        training_info = folder / "training_info.json"
    info = _load_json(training_info) or {}
    if "recipe" in info:
        raise ValueError(
            "training_info is the training_metrics.json of `eagle3-hub train`: write the card with "
            "eagle3_hub.publish.write_card (or `eagle3-hub card`), which reads it as training information."
        )
    if bench_json is None and (folder / "bench.json").is_file():
        bench_json = folder / "bench.json"
    bench = _load_json(bench_json)
    if bench is not None and not isinstance(bench_json, dict) and Path(bench_json).resolve() != (folder / "bench.json").resolve():
        atomic_copy(bench_json, folder / "bench.json")
        if chart is None and (Path(bench_json).parent / "bench.png").is_file():
            chart = Path(bench_json).parent / "bench.png"
    if chart is not None and Path(chart).resolve() != (folder / "bench.png").resolve():
        atomic_copy(chart, folder / "bench.png")
    chart_name = "bench.png" if (folder / "bench.png").is_file() and bench is not None else None

    target = base_model or info.get("target") or previous.get("base_model") or config.get("target_name_or_path")
    if target is None and bench is not None:
        target = bench.get("settings", {}).get("target")
    hub_target = target_hub_id(target) if (target is not None or "target" in info) else None
    licence = (
        {"license": license}
        if license
        else (
            {k: previous[k] for k in ("license", "license_name", "license_link") if previous.get(k)}
            or (target_license(target) if (target is not None or "target" in info) else {})
        )
    )
    data_ids = datasets or info.get("datasets") or previous.get("datasets") or []
    data_ids = [
        d
        for d in (data_ids if isinstance(data_ids, list) else [data_ids])
        if isinstance(d, str) and HUB_ID_PATTERN.fullmatch(d) and not Path(d).exists()
    ]

    card_data = ModelCardData(
        base_model=hub_target,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=list(TAGS),
        datasets=data_ids or None,
        **licence,
    )
    repo = repo_id or previous.get("eagle3_hub_repo") or REPO_PLACEHOLDER  # a local path means nothing where it is read
    target_text = f"[{hub_target}](https://huggingface.co/{hub_target})" if hub_target else f"`{target or 'its target'}`"
    target_code = hub_target or TARGET_PLACEHOLDER
    tree_params = None
    if bench:
        for sweep in (bench.get("sweep") or {}).values():
            tree_params = {k: v for k, v in (sweep.get("best") or {}).items() if k != "speedup"} or None
            break
        if tree_params is None and bench["settings"].get("tree") and len(bench["settings"]["tree"]) == 1:
            tree_params = bench["settings"]["tree"][0] or None
    name = (folder.resolve().name if repo == REPO_PLACEHOLDER else repo).rstrip("/").split("/")[-1]
    derived = named_target(target) if isinstance(target, str) else None
    derived = derived if derived is not None and derived.derivative_terms else None
    if derived is not None:
        _write_derivative_terms(folder, derived)
    license_text = (
        derived.derivative_terms
        if derived is not None
        else (
            f"`{licence['license']}`, the license of the target model."
            if licence.get("license")
            else "Same terms as the target model."
        )
    )
    body = "\n".join(
        part
        for part in (
            CARD_MARKER,
            _what_section(name, target_text, config, count_parameters(folder)),
            _usage_section(repo, target_code, config, tree_params, prompt_only="prompt format" in info),
            _bench_section(bench, chart_name, target_code, repo) if bench else "",
            _training_section({k: v for k, v in info.items()}),
            "## License\n\n" + license_text + "\n",
            "## Citation\n\n```bibtex\n@article{li2025eagle3,\n  title={{EAGLE-3}: Scaling up Inference Acceleration of "
            "Large Language Models via Training-Time Test},\n  author={Li, Yuhui and Wei, Fangyun and Zhang, Chao and "
            "Zhang, Hongyang},\n  journal={arXiv preprint arXiv:2503.01840},\n  year={2025}\n}\n```\n",
        )
        if part
    )
    if repo_id or previous.get("eagle3_hub_repo"):
        card_data.eagle3_hub_repo = repo  # serialised by the card's YAML writer, never pasted into the header
    meta = card_data.to_yaml()
    card = ModelCard(f"---\n{meta}\n---\n\n{body}")
    with atomic_path(readme) as tmp:
        card.save(tmp)
    return readme
