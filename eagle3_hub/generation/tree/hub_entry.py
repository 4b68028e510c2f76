"""The entry point of a draft repo's ``custom_generate/generate.py`` (``write_custom_generate`` copies this file
there, its sibling modules next to it), so that

    target.generate(ids, custom_generate="user/draft-repo", trust_remote_code=True)

runs tree decoding without the eagle3_hub package installed: transformers calls ``generate(model=target, ...)``
below with the arguments of its own ``generate``.
"""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

from transformers import StoppingCriteriaList
from transformers.generation.stopping_criteria import StopStringCriteria

from .api import load_draft, tree_generate


def generate(
    model,
    inputs=None,
    generation_config=None,
    logits_processor=None,
    stopping_criteria=None,
    prefix_allowed_tokens_fn=None,
    synced_gpus=None,
    assistant_model=None,
    streamer=None,
    negative_prompt_ids=None,
    negative_prompt_attention_mask=None,
    draft=None,
    tokenizer=None,
    **kwargs,
):
    """Loads the draft from the same repo (unless ``draft=`` is given) and runs ``tree_generate`` through
    transformers; the tree-shape keywords of ``tree_generate`` pass through."""
    if negative_prompt_ids is not None or negative_prompt_attention_mask is not None:
        raise ValueError("Tree decoding does not support negative prompts.")
    if draft is None:
        draft = assistant_model
    repo, revision, trust_remote_code = _custom_generate_source()
    if draft is None:
        if repo is None:
            raise ValueError("Could not tell which repo this custom_generate came from: pass draft=... explicitly.")
        draft = load_draft(repo, model, revision, trust_remote_code=trust_remote_code)
    elif isinstance(draft, (str, Path)):
        draft = load_draft(str(draft), model, trust_remote_code=trust_remote_code)
    stop_strings = kwargs.pop("stop_strings", None)
    if generation_config is not None and getattr(generation_config, "stop_strings", None):
        stop_strings = stop_strings or generation_config.stop_strings
        generation_config = copy.deepcopy(generation_config)
        generation_config.stop_strings = None
    criteria = StoppingCriteriaList(stopping_criteria or [])
    if stop_strings:
        if tokenizer is None:
            raise ValueError("stop_strings need the target's tokenizer: pass tokenizer=...")
        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    # the class's generate: an instance whose `generate` was replaced by this file would loop
    return type(model).generate(
        model,
        inputs,
        generation_config=generation_config,
        logits_processor=logits_processor,
        stopping_criteria=criteria,
        prefix_allowed_tokens_fn=prefix_allowed_tokens_fn,
        custom_generate=tree_generate,
        draft=draft,
        eagle_streamer=streamer,
        **kwargs,
    )


def _custom_generate_source() -> tuple[str | None, str | None, bool | None]:
    """(repo, revision, trust_remote_code) of the ``target.generate(custom_generate="repo", ...)`` call up the stack.

    transformers hands a custom generate function neither the repo it came from nor the caller's
    ``trust_remote_code`` (it runs from transformers' module cache, and no documented API names the repo), so both
    are read from the caller's ``generate`` frame: the repo to load the draft from, and the caller's own word on
    running its code, passed on as they said it (transformers ran this file only with it)."""
    frame = inspect.currentframe()
    while frame is not None:
        local = frame.f_locals
        if frame.f_code.co_name == "generate" and isinstance(local.get("custom_generate"), str) and "self" in local:
            extra = local.get("kwargs") or {}
            return local["custom_generate"], extra.get("revision"), local.get("trust_remote_code")
        frame = frame.f_back
    return None, None, None
