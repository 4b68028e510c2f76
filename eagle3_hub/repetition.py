"""Loops in generated text: the share of an output's n-grams that repeat an earlier n-gram of the same output.

A base model's greedy continuation often falls into a loop ("I think it was 1999.\n" again and again). Drafting a
loop is easy (prompt lookup copies it), so a speed-up measured on looping text says little about text people keep.
The bench reports this share beside every row and flags the rows above ``LOOP_SHARE_FLAG``; training data cuts
answers above a recipe's ``data.max_repeat_share`` where their loop begins (``loop_start``). Both count token ids of
the target's tokenizer, so a share means the same in a bench row and in a recipe.
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


def loop_start(tokens: Sequence, n: int = LOOP_NGRAM, min_run: int = LOOP_NGRAM) -> int | None:
    """Where ``tokens`` start to loop: the index of the first n-gram of the first run of ``min_run`` consecutive
    n-grams that each repeat an earlier one (text said again word for word, ``n + min_run - 1`` tokens at least),
    else of the first n-gram that repeats one; None when none does. ``tokens[:start]`` says everything once: a
    looping sentence's first time is kept, and a lone phrase that recurs before the loop does not cut it short."""
    seen, first, run_from, run = set(), None, 0, 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        if gram in seen:
            run_from, run = (i, 1) if run == 0 else (run_from, run + 1)
            first = i if first is None else first
            if run >= min_run:
                return run_from
        else:
            run = 0
        seen.add(gram)
    return first


__all__ = ["LOOP_NGRAM", "LOOP_SHARE_FLAG", "loop_start", "repeated_ngram_share", "repeated_ngrams"]
