"""How long the lookup branch's copies hold, by the length of the match they come from; the evidence behind
``LOOKUP_SHARE`` in ``eagle3_hub/generation/tree_decoding.py``.

On the target's own greedy answers to the first 10 questions of each suite (``acceptance_by_stage/
target_answers.jsonl``), at every answer position: the length n (0-3) of the text's longest suffix seen before,
and how many of the 40 tokens copied after it (``_PromptLookup``) equal the answer's next tokens.

Then a rough estimate of tokens per step and speed for several chain-length rules, stepping through the same
answers: each step accepts the longer of the lookup match and a draw from the tree's own acceptance histogram
(stage-4 draft, lookup off, MT-bench, ``bench_lookup_branch/bench.json``), plus one token. A step costs 18 ms of
draft, 6 ms of bookkeeping and one target forward of 9 + chain tokens (``forward_cost.py``, session 7: 1 / 8 / 9 /
12 / 16 / 19 / 20 / 24 / 28 / 32 / 40 / 48 tokens: 69 / 101 / 107 / 115 / 124 / 137 / 134 / 155 / 152 / 171 / 194
/ 231 ms); plain decoding 76 ms per token (that bench). The estimate picks a rule; the benchmark
(``lookup_share_ab.sh``) measures it.

    python results/smollm2-135m-instruct/diagnostics/lookup_lengths.py

Session 7 (one run), MT-bench: after a 3-token match (1,102 positions) the copy holds 15.5 tokens on average, its
1st / 2nd / 10th / 20th token 88 / 80 / 47 / 32% of the time; after a 2-token match (182) 2.3 tokens, 45 / 26 / 6
/ 2%; after a 1-token match (463) 0.6 tokens, 19 / 8 / 2 / 0%; no match at 533. Estimate, MT-bench / HumanEval /
GSM8K: every match 10 tokens (the session-6 rule) 1.46x / 1.28x / 1.73x; LOOKUP_SHARE x 10 1.52x / 1.35x / 1.78x,
x 20 1.57x / 1.43x / 1.84x, x 30 1.55x / 1.40x / 1.82x; every match 20 1.42x / 1.26x / 1.73x. The benchmark gave
less (``bench_lookup_share/``): +3% and +8% over the session-6 rule, in two runs.
"""

import collections
import json
import random
from pathlib import Path

import numpy as np

from eagle3_hub.generation.tree_decoding import LOOKUP_SHARE, _PromptLookup
from lookup_simulation import matched  # tokens of a proposal that equal the answer's next ones (same folder)

ROOT = Path(__file__).resolve().parents[1]
ANSWERS = ROOT / "acceptance_by_stage" / "target_answers.jsonl"
TREE_BENCH = ROOT / "bench_lookup_branch" / "bench.json"
SUITES = ("mt_bench", "humaneval", "gsm8k")
COPY_ALL = {1: 1.0, 2: 1.0, 3: 1.0}
FORWARD_MS = ([1, 8, 9, 12, 16, 19, 20, 24, 28, 32, 40, 48], [69, 101, 107, 115, 124, 137, 134, 155, 152, 171, 194, 231])
DRAFT_MS, OTHER_MS, PLAIN_MS, TREE_SLOTS = 18.0, 6.0, 76.0, 9


def tree_histogram() -> list[int]:
    """Accepted draft tokens per step of the tree alone (lookup 0) on MT-bench: counts for 0, 1, 2, ... tokens."""
    bench = json.load(open(TREE_BENCH))
    total: list[int] = []
    for rec in bench["records"]:
        if rec["suite"] == "mt_bench" and rec["method"].endswith("lookup_tokens=0]"):
            for i, c in enumerate(rec["accept_hist"]):
                total += [0] * (i + 1 - len(total))
                total[i] += c
    return total


def hold_table(records):
    for suite in SUITES:
        ks = collections.defaultdict(list)
        for rec in (r for r in records if r["suite"] == suite):
            ids, start = rec["input_ids"], rec["prompt_tokens"]
            text = list(ids[:start])
            lookup = _PromptLookup(text, start=0, share=COPY_ALL)
            for t in range(start, len(ids)):
                proposal = lookup.propose(40)
                ks[lookup.match()[0]].append(matched(proposal, ids[t:]))
                text.append(ids[t])
        print(f"{suite}: match length, positions, mean tokens held, share holding token 1 / 2 / 3 / 5 / 10 / 20 / 40")
        for n in sorted(ks):
            k = np.array(ks[n])
            shares = " / ".join(f"{(k >= j).mean():.2f}" for j in (1, 2, 3, 5, 10, 20, 40))
            print(f"  {n}: {len(k):5d}  {k.mean():5.2f}  {shares}")


def estimate(records, lookup_tokens: int, share: dict[int, float], hist: list[int], suite: str,
             extra=None) -> tuple[float, float]:
    """(tokens per step, speed-up over plain) of one chain-length rule on one suite. ``extra(text, n)``, if given,
    proposes a second chain at each step (n: the length of the text's own match), verified alongside."""
    rng = random.Random(0)
    tokens = steps = 0
    ms = 0.0
    for rec in (r for r in records if r["suite"] == suite):
        ids, start = rec["input_ids"], rec["prompt_tokens"]
        text = list(ids[:start])
        lookup = _PromptLookup(text, start=0, share=share)
        while len(text) < len(ids):
            truth = ids[len(text) :]
            proposal = lookup.propose(lookup_tokens)
            second = extra(text, lookup.match()[0]) if extra else []
            tree = rng.choices(range(len(hist)), hist)[0]
            step = min(max(matched(proposal, truth), matched(second, truth), tree) + 1, len(truth))
            text += truth[:step]
            tokens, steps = tokens + step, steps + 1
            ms += DRAFT_MS + OTHER_MS + float(np.interp(TREE_SLOTS + len(proposal) + len(second), *FORWARD_MS))
    return tokens / steps, PLAIN_MS * tokens / ms


def main():
    records = [json.loads(line) for line in open(ANSWERS)]
    hold_table(records)
    hist = tree_histogram()
    print(f"\ntree alone, MT-bench, accepted draft tokens per step 0, 1, ...: {hist}")
    print("estimate, tokens per step / speed-up over plain: " + " | ".join(SUITES))
    rules = [
        ("every match 10 (session 6)", 10, COPY_ALL),
        ("every match 20", 20, COPY_ALL),
        ("every match 40", 40, COPY_ALL),
        ("LOOKUP_SHARE x 10", 10, LOOKUP_SHARE),
        ("LOOKUP_SHARE x 20", 20, LOOKUP_SHARE),
        ("LOOKUP_SHARE x 30", 30, LOOKUP_SHARE),
        ("LOOKUP_SHARE x 40", 40, LOOKUP_SHARE),
    ]
    for name, m, share in rules:
        cells = [estimate(records, m, share, hist, s) for s in SUITES]
        print(f"  {name:28s} " + " | ".join(f"{a:.2f} / {x:.2f}x" for a, x in cells), flush=True)


if __name__ == "__main__":
    main()
