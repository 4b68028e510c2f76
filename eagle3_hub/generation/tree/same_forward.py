"""Plain decoding through the target forward that tree decoding verifies with: the baseline that isolates what
speculation alone buys, and a faster plain decoder for training data (``data.regenerate_with: same_forward``).

Tree decoding on a CPU runs its verifications through a lean target forward (``LeanTargetForward``: the same
computation as transformers' forward without its per-module plumbing), computes logits through a oneDNN-packed copy
of the output head, and keeps keys and values in one preallocated buffer (``TreeKVCache``). Part of its speed-up
over ``target.generate`` is those fast paths, not speculation. ``same_forward_generate`` decodes one token per step
through tree decoding's own ``Verifier`` (each step verifies a tree without nodes), so it takes those pieces by the
same rules (the lean forward and the packed head only where they reproduce the model's own outputs), at any batch
size, and ``tree / same_forward`` is the speed-up of speculation alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .acceptance import Processing, sampling_warpers
from .outputs import PhaseClock, TreeDecodingStats
from .verification import Tree, Verifier


@dataclass
class SameForwardStats:
    target_forwards: int = 0  # the prefill included
    verify_time_s: float = 0.0  # time inside the target (forward + head)
    lean_forward: bool = False  # the steps ran through LeanTargetForward
    packed_head: bool = False  # the logits came from the oneDNN-packed head


@torch.inference_mode()
def same_forward_generate(
    target,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    attention_mask: torch.Tensor | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, SameForwardStats]:
    """Decode ``input_ids`` (b, L), left-padded when b > 1, one token per step: each step is a verification of a
    tree without nodes, by tree decoding's own ``Verifier`` (its prefill, forward, head, cache and masks). Returns
    (sequences (b, L + n), stats); a row that stopped is padded with ``pad_token_id`` while the others go on, as
    ``generate`` does. Greedy output equals ``target.generate``'s in float32."""
    if input_ids.dim() != 2 or input_ids.shape[0] < 1:
        raise ValueError(f"input_ids must be (batch, prompt_len), got {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    eos_ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    pad = pad_token_id if pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    device = input_ids.device
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    b, L = input_ids.shape
    stats = TreeDecodingStats()
    verifier = Verifier(target, [], stats, PhaseClock(stats, device))  # no aux features: nobody drafts
    verifier.start(L + max_new_tokens + 1)
    holes = b > 1 or not bool(attention_mask.bool().all())
    logits, _, pos, _ = verifier.prefill(input_ids, attention_mask, holes)
    process = Processing(sampling_warpers(do_sample, temperature, top_k, top_p), do_sample, generator)
    process.reserve(b, device)
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
    no_nodes = torch.zeros(b, 0, dtype=torch.long, device=device)
    keep_slot, valid = torch.zeros(b, 1, dtype=torch.long, device=device), torch.ones(b, 1, dtype=torch.bool, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    next_pos = pos[:, -1] + 1
    new: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        token = process.next_token(logits[:, -1], None)
        token = torch.where(done, pad, token)
        new.append(token)
        done |= torch.isin(token, eos)
        if step == max_new_tokens - 1 or bool(done.all()):
            break
        tree = Tree.build(token, no_nodes, no_nodes, no_nodes, None, 0)
        logits, _, _, q_pos = verifier.verify(tree, next_pos, verifier.logits_rows(tree))
        verifier.commit(keep_slot, valid, q_pos)
        next_pos = next_pos + 1
    out = SameForwardStats(stats.target_forwards, stats.verify_time_s, stats.lean_forward, verifier.packed_head is not None)
    return torch.cat([input_ids, torch.stack(new, dim=1)], dim=1), out
