"""How many tokens per step copying could give, without a draft model: on the target's own greedy answers to the
first 10 questions of each suite (``acceptance_by_stage/target_answers.jsonl``), teacher-forced, each step accepts
the longest prefix of a proposal that matches the answer, plus one token. Proposals:

- ``own text``: the tree decoder's lookup branch (``_PromptLookup``: the continuation of the latest earlier
  occurrence of the text's last 1-3 tokens, prompt included), 10 tokens;
- ``datastore``: a trigram table (backing off to bigrams seen at least twice) of the target's answers in the
  reference draft's training data (``results/smollm2-135m-instruct/data/regenerated*.jsonl``, no benchmark
  question), walked greedily for 6 tokens; not part of the package, an experiment for a next step;
- both: the longer match of the two, as two branches of one tree would give.

    python results/smollm2-135m-instruct/diagnostics/lookup_simulation.py

Session 6 (one run): own text 1.90 / 1.61 / 2.64 tokens per step (MT-bench / HumanEval / GSM8K); datastore alone
1.19 / 1.33 / 1.37; both 2.16 / 2.15 / 3.51.
"""

import collections
import glob
import json
from pathlib import Path

from eagle3_hub.generation.tree_decoding import _PromptLookup
from eagle3_hub.targets import load_target

ROOT = Path(__file__).resolve().parents[1]
ANSWERS = ROOT / "acceptance_by_stage" / "target_answers.jsonl"


def trigram_table(tokenizer) -> list[dict]:
    """n (1..3) -> {previous n tokens: (most frequent next token, its count)} over the training answers."""
    texts = []
    for path in sorted(glob.glob(str(ROOT / "data" / "regenerated*.jsonl"))):
        for line in open(path):
            texts += [m["content"] for m in json.loads(line)["messages"] if m["role"] == "assistant"]
    counts = [collections.defaultdict(collections.Counter) for _ in range(4)]
    for seq in tokenizer(texts, add_special_tokens=False).input_ids:
        for i in range(len(seq)):
            for n in range(1, 4):
                if i >= n:
                    counts[n][tuple(seq[i - n : i])][seq[i]] += 1
    return [{k: c.most_common(1)[0] for k, c in d.items()} for d in counts]


def datastore_proposal(table, context: list[int], k: int = 6) -> list[int]:
    out, ctx = [], list(context)
    for _ in range(k):
        for n in (3, 2):
            hit = table[n].get(tuple(ctx[-n:]))
            if hit and hit[1] >= 2:
                out.append(hit[0])
                ctx.append(hit[0])
                break
        else:
            break
    return out


def matched(proposal: list[int], truth: list[int]) -> int:
    n = 0
    for a, b in zip(proposal, truth):
        if a != b:
            break
        n += 1
    return n


def main():
    _, tokenizer = load_target(None)
    table = trigram_table(tokenizer)
    records = [json.loads(line) for line in open(ANSWERS)]
    for name in ("own text", "datastore", "both"):
        per_suite = collections.defaultdict(lambda: [0, 0])  # new tokens, steps
        for rec in records:
            ids, start = rec["input_ids"], rec["prompt_tokens"]
            text = list(ids[:start])
            lookup = _PromptLookup(text, start=0)
            while len(text) < len(ids):
                truth = ids[len(text) :]
                own = matched(lookup.propose(10), truth) if name != "datastore" else 0
                store = matched(datastore_proposal(table, text), truth) if name != "own text" else 0
                text += truth[: max(own, store) + 1]
                per_suite[rec["suite"]][1] += 1
            per_suite[rec["suite"]][0] += len(ids) - start
        print(f"{name}: " + ", ".join(f"{s} {n / steps:.2f}" for s, (n, steps) in per_suite.items()), flush=True)


if __name__ == "__main__":
    main()
