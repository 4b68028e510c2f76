"""The entry point of a draft repo's ``custom_generate/generate.py`` (``write_custom_generate`` copies this file
there, its sibling modules next to it), so that

    target.generate(ids, custom_generate="user/draft-repo", trust_remote_code=True)

runs tree decoding without the eagle3_hub package installed: transformers calls ``generate(model=target, ...)``
below with the arguments of its own ``generate``. The draft is ``draft=`` when the caller names it (a loaded model, a
repo id or a folder), else the one in the repo this file came from (``hub_caller``: transformers does not say which).
"""

from __future__ import annotations

import copy
from pathlib import Path

from transformers import StoppingCriteriaList
from transformers.generation.stopping_criteria import StopStringCriteria

from .api import load_draft, tree_generate
from .hub_caller import custom_generate_call


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
    revision=None,
    **kwargs,
):
    """Runs ``tree_generate`` through transformers with ``draft``: a loaded EAGLE-3 draft, a repo id or a folder
    (``draft="user/draft-repo"``), or by default the draft in the repo this file came from. Code of a repo loads only
    with the caller's ``trust_remote_code=True`` (``hub_caller``). The tree-shape keywords of ``tree_generate`` pass
    through. ``revision``: the repo's revision, which transformers hands over with the other arguments; it is the
    repo's, not ``generate``'s, so it is not passed on."""
    if negative_prompt_ids is not None or negative_prompt_attention_mask is not None:
        raise ValueError("Tree decoding does not support negative prompts.")
    if draft is None:
        draft = assistant_model
    if draft is None:
        call = custom_generate_call()
        if call.repo is None:
            raise ValueError(
                "Could not tell which repo this custom_generate came from: pass the draft explicitly, "
                "draft='user/draft-repo' (or a loaded draft)."
            )
        draft = load_draft(call.repo, model, revision, trust_remote_code=call.trust_remote_code)
    elif isinstance(draft, (str, Path)):
        draft = load_draft(str(draft), model, trust_remote_code=custom_generate_call().trust_remote_code)
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
