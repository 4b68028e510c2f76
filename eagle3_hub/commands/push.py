"""``eagle3-hub push``: upload a draft folder to the Hugging Face Hub (library: ``eagle3_hub.hub.push_draft``, through
``eagle3_hub.publish.push`` for the card's training information).

A folder that is not a saved draft is bad input (exit 2, like every command); a push that the Hub refuses or
cannot receive (no token, offline, 401/403) says what to do and exits 1.
"""

from __future__ import annotations

import sys


def add_arguments(parser):
    parser.add_argument("draft", help="folder of a saved draft")
    parser.add_argument("repo_id", help="Hub repository, `name` (your namespace) or `owner/name`")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or `hf auth login`)")
    parser.add_argument("--message", default=None, help="commit message")
    parser.add_argument("--no-card", action="store_true", help="do not write or refresh README.md")


def run(args) -> int:
    from ..card import check_repo_id
    from ..hub import HubPushError, check_draft_folder
    from ..publish import push

    check_draft_folder(args.draft)  # not a saved draft: a ValueError, one line and exit 2 from the CLI
    check_repo_id(args.repo_id)
    try:
        url = push(
            args.draft,
            args.repo_id,
            private=args.private,
            token=args.token,
            commit_message=args.message,
            update_card=not args.no_card,
        )
    except HubPushError as e:
        print(f"eagle3-hub push: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    print(f"Uploaded {args.draft} -> {url}")
    return 0
