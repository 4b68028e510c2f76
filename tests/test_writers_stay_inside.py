"""Writers stay inside the folder they were given: push, card, the Space export and convert --force touch only what
is theirs (links leaving the folder, hand-written cards, a user's file named in a manifest, a nested .git)."""

from __future__ import annotations

import json
import logging
import os

import pytest
from hub_server import FakeHub
from test_card_hub import TOKEN, hub_client_settings, make_draft_folder  # noqa: F401 (the fixture is autouse there)

from eagle3_hub.card import card_is_ours, write_model_card
from eagle3_hub.hub import NotADraftFolder, check_draft_folder, files_to_upload, push_draft


def test_push_never_uploads_a_link_that_leaves_the_folder(tmp_path, caplog):
    draft = make_draft_folder(tmp_path / "draft")
    secret = tmp_path / "token"
    secret.write_text("hf_secret_token\n")
    os.symlink(secret, draft / "notes.txt")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "data.txt").write_text("private")
    os.symlink(tmp_path / "elsewhere", draft / "more")
    (draft / "inside.txt").write_text("mine")
    os.symlink("inside.txt", draft / "alias.txt")  # a link that stays inside is uploaded as the file it names
    with caplog.at_level(logging.WARNING, logger="eagle3_hub.hub"):
        files = files_to_upload(draft)
    assert "notes.txt" not in files and not any(k.startswith("more") for k in files)
    assert files["alias.txt"].read_text() == "mine" and "inside.txt" in files
    assert "notes.txt" in caplog.text and "outside" in caplog.text and "more" in caplog.text
    with FakeHub({TOKEN: "alice"}) as hub:
        push_draft(draft, "alice/x", token=TOKEN, endpoint=hub.url)
        uploaded = hub.repo("alice/x").files
        assert "notes.txt" not in uploaded and b"hf_secret_token" not in b"".join(uploaded.values())


def test_push_refuses_a_folder_whose_only_weights_are_a_pickle(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04 a pickle")
    with pytest.raises(NotADraftFolder, match=r"pickled.*only as a pickle \(pytorch_model\.bin\).*safetensors only"):
        check_draft_folder(folder)
    with pytest.raises(NotADraftFolder, match="pickle"):
        push_draft(folder, "alice/x", token=TOKEN)
    # weights linked in from outside do not count as the folder's own
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "config.json").write_text("{}")
    draft = make_draft_folder(tmp_path / "draft")
    os.symlink(draft / "model.safetensors", linked / "model.safetensors")
    with pytest.raises(NotADraftFolder, match="has no weights"):
        check_draft_folder(linked)


def test_card_never_replaces_a_readme_it_did_not_write_without_force(tmp_path, capsys):
    import argparse

    from eagle3_hub.commands import card as card_command

    draft = make_draft_folder(tmp_path / "draft")
    mine = "# My draft\n\nNotes I wrote by hand.\n"
    (draft / "README.md").write_text(mine)
    with pytest.raises(FileExistsError, match=r"README\.md was not written by eagle3-hub.*--force"):
        write_model_card(draft, license="mit")
    assert (draft / "README.md").read_text() == mine
    parser = argparse.ArgumentParser()
    card_command.add_arguments(parser)
    with pytest.raises(FileExistsError):
        card_command.run(parser.parse_args([str(draft), "--license", "mit"]))
    assert (draft / "README.md").read_text() == mine
    assert card_command.run(parser.parse_args([str(draft), "--license", "mit", "--force"])) == 0
    assert card_is_ours(draft / "README.md")
    write_model_card(draft, license="mit")  # its own card: rewritten without --force


@pytest.mark.parametrize("bad", ["alice/x\nlicense: evil", "alice/x: y", "a/b/c", "alice/x'", ""])
def test_repo_ids_are_validated_before_reaching_a_card_or_the_hub(tmp_path, bad):
    from huggingface_hub import ModelCard

    draft = make_draft_folder(tmp_path / "draft")
    with pytest.raises(ValueError, match="--repo-id .* is not a Hub repository id"):
        write_model_card(draft, repo_id=bad, license="mit")
    assert not (draft / "README.md").exists()
    with pytest.raises(ValueError, match="is not a Hub repository id"):
        push_draft(draft, bad, token=TOKEN, endpoint="http://127.0.0.1:9")  # refused before any request
    write_model_card(draft, repo_id="alice/x", license="mit")
    card = ModelCard.load(draft / "README.md")
    assert card.data.license == "mit" and card.data.to_dict()["eagle3_hub_repo"] == "alice/x"
    # a card whose header was edited to hold a bad repository does not carry it on
    (draft / "README.md").write_text(
        (draft / "README.md").read_text().replace("eagle3_hub_repo: alice/x", "eagle3_hub_repo: 'a: b'")
    )
    write_model_card(draft, license="mit")
    assert "eagle3_hub_repo" not in ModelCard.load(draft / "README.md").data.to_dict()


def test_cli_refuses_a_bad_repo_id_in_one_line(tmp_path):
    import subprocess
    import sys

    draft = make_draft_folder(tmp_path / "draft")
    for args in (["card", str(draft), "--repo-id", "a b"], ["push", str(draft), "a b", "--token", "x"]):
        done = subprocess.run(
            [sys.executable, "-m", "eagle3_hub.cli", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            timeout=120,
        )
        assert done.returncode == 2 and "is not a Hub repository id" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_export_space_keeps_a_users_file_its_manifest_lists_as_stale(tmp_path, caplog):
    from test_reliability import fake_wheel

    from eagle3_hub.space import MANIFEST, export_space

    dest = tmp_path / "space"
    export_space(dest, wheel=fake_wheel(tmp_path / "w1", "0.1.0"))
    manifest = json.loads((dest / MANIFEST).read_text())
    assert "eagle3_hub-0.1.0-py3-none-any.whl" in manifest["files"]
    (dest / "eagle3_hub-0.1.0-py3-none-any.whl").write_bytes(b"the user's own build, same name")
    with caplog.at_level(logging.WARNING, logger="eagle3_hub.space"):
        export_space(dest, wheel=fake_wheel(tmp_path / "w2", "0.2.0"))
    assert (dest / "eagle3_hub-0.1.0-py3-none-any.whl").read_bytes() == b"the user's own build, same name"
    assert "kept" in caplog.text and "eagle3_hub-0.1.0-py3-none-any.whl" in caplog.text
    assert "eagle3_hub-0.1.0-py3-none-any.whl" not in json.loads((dest / MANIFEST).read_text())["files"]
    export_space(dest, wheel=fake_wheel(tmp_path / "w3", "0.3.0"))  # its own unchanged stale wheel still goes
    assert not (dest / "eagle3_hub-0.2.0-py3-none-any.whl").exists()
    assert (dest / "eagle3_hub-0.1.0-py3-none-any.whl").exists()


@pytest.mark.parametrize("sign", ["sub/.git", "a/b/.hg", "sub/.git-file"])
def test_convert_force_looks_for_version_control_at_every_depth(tmp_path, sign):
    from eagle3_hub.formats import convert

    src = make_draft_folder(tmp_path / "src")
    out = tmp_path / "out"
    (out / "model").mkdir(parents=True)
    (out / "model" / "old.txt").write_text("an earlier output")
    if sign.endswith("-file"):  # a git worktree or submodule marks itself with a .git file
        (out / "sub").mkdir()
        (out / "sub" / ".git").write_text("gitdir: /elsewhere\n")
    else:
        (out / sign).mkdir(parents=True)
        (out / sign / "HEAD").write_text("ref: refs/heads/main\n")
    with pytest.raises(ValueError, match=r"version-control folder .*--force never replaces one"):
        convert(str(src), str(out), force=True)
    assert (out / "model" / "old.txt").read_text() == "an earlier output"
