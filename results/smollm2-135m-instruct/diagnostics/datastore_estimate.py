"""Would a datastore branch pay next to the draft tree and the lookup branch? (Session 8: no; not built.)

The step-by-step estimate of ``lookup_lengths.py`` (each step accepts the longest of: the lookup branch's match
under ``LOOKUP_SHARE`` x 20, a draw from the tree's own acceptance histogram, and here also a *datastore* chain;
plus one token; a step costs the draft, the bookkeeping and one target forward of 9 + chain tokens), with the
datastore of ``lookup_simulation.py``: a trigram table (bigrams as a fallback) of the target's answers in the
reference draft's training data, walked greedily for k tokens. Optimistic: it draws the tree's acceptance
independently of the datastore's, where both learn the same formulaic phrases.

    python results/smollm2-135m-instruct/diagnostics/datastore_estimate.py

Session 8 (one run), tokens per step / speed-up over plain, MT-bench | HumanEval | GSM8K:
no datastore 2.95 / 1.57x | 2.64 / 1.43x | 3.61 / 1.84x; datastore of 4 tokens where the text's own match is
shorter than 3 tokens 3.11 / 1.60x | 2.84 / 1.45x | 4.06 / 1.97x; 6 tokens 1.57x | 1.42x | 1.96x; 10 tokens 1.51x |
1.40x | 1.88x; 6 tokens at every step 1.55x | 1.41x | 1.94x. At most +2% on MT-bench even as estimated here.
"""

import json
import random

import numpy as np
from lookup_lengths import (  # same folder
    ANSWERS,
    DRAFT_MS,
    FORWARD_MS,
    OTHER_MS,
    PLAIN_MS,
    SUITES,
    TREE_SLOTS,
    tree_histogram,
)
from lookup_simulation import datastore_proposal, matched, trigram_table

from eagle3_hub.generation.tree_decoding import LOOKUP_SHARE, _PromptLookup
from eagle3_hub.targets import load_target

LOOKUP_TOKENS = 20


def estimate(records, table, hist, suite: str, datastore_tokens: int, only_after_weak_match: bool):
    """(tokens per step, speed-up over plain) with a datastore chain of ``datastore_tokens`` (0: none)."""
    rng = random.Random(0)
    tokens = steps = 0
    ms = 0.0
    for rec in (r for r in records if r["suite"] == suite):
        ids, start = rec["input_ids"], rec["prompt_tokens"]
        text = list(ids[:start])
        lookup = _PromptLookup(text, start=0, share=LOOKUP_SHARE)
        while len(text) < len(ids):
            truth = ids[len(text) :]
            own = lookup.propose(LOOKUP_TOKENS)
            weak = lookup.match()[0] < 3
            store = datastore_proposal(table, text, datastore_tokens) if datastore_tokens and (weak or not only_after_weak_match) else []
            tree = rng.choices(range(len(hist)), hist)[0]
            step = min(max(matched(own, truth), matched(store, truth), tree) + 1, len(truth))
            text += truth[:step]
            tokens, steps = tokens + step, steps + 1
            ms += DRAFT_MS + OTHER_MS + float(np.interp(TREE_SLOTS + len(own) + len(store), *FORWARD_MS))
    return tokens / steps, PLAIN_MS * tokens / ms


def main():
    _, tokenizer = load_target(None)
    table = trigram_table(tokenizer)
    records = [json.loads(line) for line in ANSWERS.read_text().splitlines()]
    hist = tree_histogram()
    print("tokens per step / speed-up over plain: " + " | ".join(SUITES))
    for k, weak in [(0, False), (4, True), (6, True), (10, True), (6, False)]:
        name = "no datastore" if not k else f"datastore {k} tokens" + (" after a weak own match" if weak else ", always")
        cells = [estimate(records, table, hist, s, k, weak) for s in SUITES]
        print(f"  {name:40s} " + " | ".join(f"{a:.2f} / {x:.2f}x" for a, x in cells), flush=True)


if __name__ == "__main__":
    main()
