"""The lookup branch (prompt lookup / n-gram speculation): draft tokens copied from a row's own text."""

from __future__ import annotations

# share of lookup_tokens proposed after a match of the text's last 3 / 2 / 1 tokens (rounded, at least 1): a copy
# after a short match rarely holds for long, so a long chain there is verification spent for nothing
LOOKUP_SHARE = {3: 1.0, 2: 0.3, 1: 0.15}


class PromptLookup:
    """Draft tokens copied from a row's own text: after the latest earlier occurrence of the text's longest suffix
    of 3 down to 1 tokens, the tokens that followed it, ``m * share[n]`` of them (rounded, at least 1) after an
    n-token match. A copy that reaches the end of the text goes on with the tokens it has copied (as an LZ77 match
    may overlap itself), so a loop of period P is proposed in full, not only its first P tokens. ``tokens`` is the
    row's list, which the decoder appends to; positions before ``start`` (left padding) are never matched.
    Indexing is incremental: each new token costs 3 dict writes."""

    def __init__(self, tokens: list[int], start: int, share: dict[int, float] = LOOKUP_SHARE):
        self.tokens, self.start, self.share = tokens, start, share
        self.max_ngram = max(share)
        self.next_of: dict[tuple[int, ...], int] = {}  # n-gram -> position right after its latest occurrence
        self.indexed = start + 1  # positions p < indexed have their n-grams ending at p - 1 in next_of

    def match(self) -> tuple[int, int]:
        """(n, p): the longest suffix of the text seen before has n tokens (0: none) and was followed by t[p]."""
        t = self.tokens
        for p in range(self.indexed, len(t)):  # the n-grams ending at p - 1, each followed by t[p]
            for n in range(1, min(self.max_ngram, p - self.start) + 1):
                self.next_of[tuple(t[p - n : p])] = p
        self.indexed = max(self.indexed, len(t))
        for n in range(min(self.max_ngram, len(t) - self.start), 0, -1):
            p = self.next_of.get(tuple(t[-n:]))
            if p is not None:
                return n, p
        return 0, 0

    def propose(self, m: int) -> list[int]:
        n, p = self.match()
        if not n:
            return []
        t = self.tokens
        m = max(1, round(m * self.share[n]))
        out = t[p : p + m]
        while len(out) < m:  # past the end: the copy continues from what it copied
            out.append(out[p + len(out) - len(t)])
        return out
