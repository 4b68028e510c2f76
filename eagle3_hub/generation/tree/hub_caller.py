"""What transformers does not tell a Hub ``custom_generate``: the repository it came from and the caller's consent.

``target.generate(ids, custom_generate="user/draft-repo", trust_remote_code=True)`` makes transformers check its
``trust_remote_code`` gate (``GenerationMixin.load_custom_generate``), import the repo's ``custom_generate/generate.py``
and call its ``generate(model=target, ...)`` with the other arguments of ``generate``, but without the repo id, the
and ``trust_remote_code``: it pops them first, and no documented API hands them over (transformers 5.19 to 5.25; the
``revision=`` does come with the other arguments). The draft lives in that repo and its modeling code is code from that
repo, so ``hub_entry`` reads the two from transformers' ``generate`` frame, here and nowhere else, and only when it
needs them: the repo when the caller passed no ``draft=``, the consent when a draft is loaded from a repo id or folder.

The consent is the caller's own ``trust_remote_code`` argument, the value transformers' gate read: the draft's code
runs only with ``trust_remote_code=True``, as the file itself did (on every transformers version, including those
that ran a local folder's ``custom_generate`` without asking). Where the frame is not found (another caller, a
transformers release that renames it), the answer is ``None``: no repo (``draft=`` must be given) and no consent.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple


class CustomGenerateCall(NamedTuple):
    repo: str | None  # the `custom_generate=` string of the call: a Hub repo id or a local folder
    trust_remote_code: bool | None  # the caller's argument, as transformers' gate read it


def custom_generate_call() -> CustomGenerateCall:
    """The nearest ``GenerationMixin.generate(self, ..., custom_generate="...")`` up the stack, or all ``None``."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            local = frame.f_locals
            if frame.f_code.co_name == "generate" and isinstance(local.get("custom_generate"), str) and "self" in local:
                return CustomGenerateCall(local["custom_generate"], local.get("trust_remote_code"))
            frame = frame.f_back
    finally:
        del frame  # a frame held in a local keeps every frame above it alive
    return CustomGenerateCall(None, None)
