"""Would a datastore branch pay next to the draft tree and the lookup branch? (Session 8: a little; not built.)

The step-by-step estimate of ``lookup_lengths.py`` (each step accepts the longest of: the lookup branch's match
under ``LOOKUP_SHARE`` x 20, a draw from the tree's own acceptance histogram, and here also a *datastore* chain;
plus one token; a step costs the draft, the bookkeeping and one target forward of 9 + chain tokens), with the
datastore of ``lookup_simulation.py``: a trigram table (bigrams as a fallback) of the target's answers in the
reference draft's training data, walked greedily for k tokens. Optimistic: it draws the tree's acceptance
independently of the datastore's, where both learn the same formulaic phrases.

    python results/smollm2-135m-instruct/diagnostics/datastore_estimate.py

Session 8, tokens per step / speed-up over plain, MT-bench | HumanEval | GSM8K. No datastore 2.95 / 1.57x |
2.64 / 1.43x | 3.61 / 1.84x. With the datastore of stages 1-6's answers (4,662): 4 tokens where the text's own
match is shorter than 3 tokens 3.18 / 1.63x | 3.01 / 1.55x | 4.06 / 1.97x; 6 tokens 1.60x | 1.51x | 1.96x; 10
tokens 1.53x | 1.43x | 1.87x; 6 tokens at every step 1.58x | 1.50x | 1.93x. With stages 1-5's answers (3,720) the
4-token rule gave 1.60x | 1.45x | 1.97x: the table grows with the training data. At most +4% on MT-bench, +8% on
HumanEval and +7% on GSM8K, as optimistically estimated here.
"""

import json

from lookup_lengths import ANSWERS, SUITES, estimate, tree_histogram  # same folder
from lookup_simulation import datastore_proposal, trigram_table

from eagle3_hub.generation.tree_decoding import LOOKUP_SHARE
from eagle3_hub.targets import load_target

LOOKUP_TOKENS = 20


def main():
    _, tokenizer = load_target(None)
    table = trigram_table(tokenizer)
    records = [json.loads(line) for line in ANSWERS.read_text().splitlines()]
    hist = tree_histogram()
    print("tokens per step / speed-up over plain: " + " | ".join(SUITES))
    for k, weak in [(0, False), (4, True), (6, True), (10, True), (6, False)]:
        name = "no datastore" if not k else f"datastore {k} tokens" + (" after a weak own match" if weak else ", always")

        def store(text, n, k=k, weak=weak):  # the datastore chain, where the text's own match is weak (n < 3)
            return datastore_proposal(table, text, k) if k and (n < 3 or not weak) else []

        cells = [estimate(records, LOOKUP_TOKENS, LOOKUP_SHARE, hist, s, extra=store) for s in SUITES]
        print(f"  {name:40s} " + " | ".join(f"{a:.2f} / {x:.2f}x" for a, x in cells), flush=True)


if __name__ == "__main__":
    main()
