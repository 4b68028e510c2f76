"""Loops in generated text: the share of an output's n-grams that repeat an earlier n-gram of the same output.

A base model's greedy continuation often falls into a loop ("I think it was 1999.\n" again and again). Drafting a
loop is easy (prompt lookup copies it), so a speed-up measured on looping text says little about text people keep.
The bench reports this share beside every row and flags the rows above ``LOOP_SHARE_FLAG``; training data can drop
answers above a recipe's ``data.max_repeat_share``.
"""

from __future__ import annotations

from collections.abc import Sequence

LOOP_NGRAM = 8  # long enough that ordinary text rarely repeats one, short enough to catch a looping sentence
LOOP_SHARE_FLAG = 0.5  # a row whose outputs repeat more than this share of their n-grams is flagged as looping


def repeated_ngram_share(tokens: Sequence, n: int = LOOP_NGRAM) -> float:
    """The share of the ``n``-grams of ``tokens`` (token ids, or words) that occurred earlier in ``tokens``;
    0.0 for text shorter than ``n + 1``."""
    total = len(tokens) - n + 1
    if total < 2:
        return 0.0
    seen, repeated = set(), 0
    for i in range(total):
        gram = tuple(tokens[i : i + n])
        repeated += gram in seen
        seen.add(gram)
    return repeated / total


def repeated_ngrams(outputs: Sequence[Sequence], n: int = LOOP_NGRAM) -> tuple[int, int]:
    """(repeated n-grams, n-grams) over several outputs, each counted within itself: the pooled share of a group
    of outputs is their ratio."""
    repeated = total = 0
    for tokens in outputs:
        count = len(tokens) - n + 1
        if count >= 2:
            repeated += round(repeated_ngram_share(tokens, n) * count)
            total += count
    return repeated, total


__all__ = ["LOOP_NGRAM", "LOOP_SHARE_FLAG", "repeated_ngram_share", "repeated_ngrams"]
