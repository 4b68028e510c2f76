"""The decoding loop: prefill, then steps of draft -> verify -> accept -> compact until every row has stopped.

Caches are rectangular over the batch: each row accepts its own number of tokens per step, the slots a row does
not use are holes masked out of every later attention, positions are explicit per row, and finished rows leave
the batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .acceptance import Processing, accept_greedy, accept_walk
from .config import TreeConfig
from .controller import StepShape, TreeController, learnt_start, remember_learnt
from .costs import step_costs
from .drafting import Drafter
from .lookup import PromptLookup
from .outputs import PhaseClock, TreeDecodingStats
from .verification import Tree, Verifier

if TYPE_CHECKING:
    from .oracle import TargetProposer


class TreeDecoder:
    """One tree-decoding run. b active rows (``rows``: their original indices), ``root`` (b,): each row's latest
    token, sampled from the target but not yet in its cache, at position ``next_pos`` (b,)."""

    def __init__(
        self,
        target,
        draft,
        config: TreeConfig,
        processing: Processing,
        *,
        eos_ids: list[int],
        pad_id: int,
        max_new_tokens: int,
        criteria: list,
        streamer=None,
        on_step: Callable | None = None,
    ):
        self.config, self.processing = config, processing
        self.eos, self.pad_id, self.max_new_tokens = set(eos_ids), pad_id, max_new_tokens
        self.criteria, self.streamer, self.on_step = criteria, streamer, on_step
        self.device = target.get_input_embeddings().weight.device
        self.stats = TreeDecodingStats(tree=config.as_stats())
        self.clock = PhaseClock(self.stats, self.device)
        self.verifier = Verifier(target, draft.config.aux_layer_ids, self.stats, self.clock)
        self.drafter: Drafter | TargetProposer = Drafter(draft, target, config, self.stats)  # or the target's proposer
        if config.draft_sampling:  # resolved: on only when sampling
            self.drafter.sample_with(processing.temperature, processing.generator)
        self.target, self.draft = target, draft
        self.controller: TreeController | None = None
        # what decides acceptance besides the text: the adaptive tree learns its rates per these
        self.settings = processing.settings + (("draft_sampling", config.draft_sampling),)

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
        """Decode; returns each row's prompt + new tokens, right-padded to a common length."""
        t_start = time.perf_counter()
        c = self.config
        b, L = input_ids.shape
        self.tokens = input_ids.tolist()
        self.generated = [0] * b
        self.rows = list(range(b))
        self.forwards = [1] * b  # target forwards per row (its prefill included)
        slots = c.total_tokens + c.lookup_tokens + 1  # the widest verification per row
        self.processing.reserve(b * slots, self.device)
        if c.adaptive:  # the machine's costs: measured once per models, device and dtype, then from the cache
            costs = step_costs(self.target, self.draft, c, b, slots)
            start = learnt_start(self.draft, self.target, c.depth, self.settings)
            self.controller = TreeController(c, costs, b, row_depths=self.drafter.levels is None, start=start)
        capacity = L + self.max_new_tokens + c.total_tokens + c.lookup_tokens + c.depth + 16
        self.verifier.start(capacity)
        self.drafter.start(b, capacity)

        # prefill: the first new token from the prompt's last position
        self.holes = b > 1 or not bool(attention_mask.bool().all())  # rows with masked slots: explicit masks
        logits, feats, pos, valid = self.verifier.prefill(input_ids, attention_mask, self.holes)
        if c.lookup_tokens:
            pads = (~valid).sum(-1).tolist()
            self.lookups = [PromptLookup(self.tokens[r], start=pads[r]) for r in range(b)]
        self.root = self.processing.next_token(logits[:, -1], lambda: [input_ids[i : i + 1] for i in range(b)])  # (b,)
        self.next_pos = pos[:, -1] + 1
        # the draft reads (feature t, token t+1) at position t: the prompt's features with the shifted prompt
        self.drafter.queue(feats, torch.cat([input_ids[:, 1:], self.root[:, None]], dim=1), pos, valid)
        if self.streamer is not None:
            self.streamer.put(input_ids[0].cpu())
        finished = self._emit_all([[tok] for tok in self.root.tolist()], [0] * b, [False] * b)
        self._drop_rows(finished)
        if self.rows:  # the prompt into the draft's cache now: part of the prefill, not of a step
            t0 = self.clock.now()
            self.drafter.read(self.holes)
            self.clock.add("draft_time_s", t0, self.clock.now())

        behind = False  # the draft has steps without a tree to read (it read the prompt with the prefill)
        while self.rows:
            left = [self.max_new_tokens - self.generated[r] for r in self.rows]  # per active row
            remaining = max(left)
            chain, proposed = self._lookup_chain(min(c.lookup_tokens, remaining - 1))
            if self.controller is None:
                depth = min(c.depth, remaining - 1)
                if self.drafter.levels is not None and depth >= 1:
                    depth = c.depth  # one shape (one graph) to the end: _emit stops each row at max_new_tokens
                self.step(depth, chain)
                continue
            t0 = time.perf_counter()
            rows, context = list(self.rows), self.verifier.cache.length
            shape = self.controller.choose(
                rows,
                0 if chain is None else chain.shape[1],
                max_depth=None if self.drafter.levels is not None else remaining - 1,
                proposed=proposed,
                behind=behind,
                context=context,
                remaining=left,
            )
            accepted, looked_up = self.step(shape.depth, chain if shape.depth and shape.lookup else None, shape)
            seconds = time.perf_counter() - t0 if len(self.rows) == len(rows) else None  # rows dropped: not timed
            self.controller.observe(rows, shape, accepted, seconds, looked_up, proposed, behind, context)
            behind = shape.depth == 0
            # a table from a busier machine (asked when the shapes were weighed: a standing choice holds its timings)
            if self.controller.weighed and not self.controller.costs.fresh and self.controller.stale:
                self.controller.replace_costs(step_costs(self.target, self.draft, c, b, slots, refresh=True))
                self.stats.costs_measured_again = True
        if self.controller is not None:
            self.stats.tree_steps = dict(self.controller.chosen)
            remember_learnt(self.draft, self.target, c.depth, self.settings, self.controller)

        self.clock.finish()
        new_max = max(self.generated) if self.generated else 0
        st = self.stats
        st.new_tokens = sum(self.generated)
        st.total_time_s = time.perf_counter() - t_start
        st.overhead_time_s = max(st.total_time_s - st.draft_time_s - st.verify_time_s, 0.0)
        st.mean_acceptance_length = st.new_tokens / max(sum(self.forwards), 1)
        return [row + [self.pad_id] * (L + new_max - len(row)) for row in self.tokens]

    def step(self, depth: int, chain: torch.Tensor | None = None, shape: StepShape | None = None) -> list[int]:
        """One draft + verify + accept + compact step. ``depth`` (tree levels; depth 0 is a plain target step) may be
        below the configured one near max_new_tokens; ``chain`` the lookup branch (b, m), proposed by the caller
        (host work while the device is idle); ``shape`` the adaptive controller's choice (default: the config's).
        Returns, per row active at the start, the draft tokens it accepted and whether they came along the lookup
        branch."""
        if depth < 1 and chain is None:
            return self.plain_step()
        b = len(self.rows)
        # 1. propose: the draft tree next to the lookup branch
        if depth >= 1:
            t0 = self.clock.now()
            step = (
                {}
                if shape is None
                else dict(
                    top_k=shape.top_k,
                    total_tokens=shape.total_tokens,
                    row_depth=None if shape.row_depth is None else torch.tensor(shape.row_depth, device=self.device),
                )
            )
            nodes = self.drafter.draft_tree(depth, self.next_pos, self.holes, **step)
            self.clock.add("draft_time_s", t0, self.clock.now())
        else:
            nodes = (torch.zeros(b, 0, dtype=torch.long, device=self.device),) * 3
        tree = Tree.build(self.root, *nodes, chain, depth, getattr(self.drafter, "proposal", None) if depth >= 1 else None)

        # 2. verify: [root, nodes] in one target forward
        keep = self.verifier.logits_rows(tree)
        logits, feats, last, q_pos = self.verifier.verify(tree, self.next_pos, keep)
        for r in self.rows:
            self.forwards[r] += 1

        # 3. accept: a path per row and the target's token after it
        def node_logits(slot, rows=None):
            return self.verifier.node_logits(logits, last, keep, slot, rows)

        if self.processing.walks:
            end, bonus = accept_walk(tree, logits, keep, node_logits, self.processing, self._history)
        else:
            end, bonus = accept_greedy(tree, logits, keep, node_logits, self.processing)
        accepted = tree.level.gather(1, end[:, None]).squeeze(1)  # accepted draft tokens per row (b,)
        W = min(tree.depth, tree.N) + 1
        slot_ids = torch.arange(tree.N + 1, device=self.device).expand(b, tree.N + 1)
        on_path = tree.anc[torch.arange(b, device=self.device), end]  # (b, S)
        path = torch.where(on_path, slot_ids, -1).sort(dim=-1).values[:, -W:]  # right-aligned slots, -1 = hole
        path_tok = tree.tok.gather(1, path.clamp(min=0))
        from_lookup = (end > tree.n_tree).long()  # the accepted path ran along the lookup branch
        host = torch.cat([accepted[:, None], bonus[:, None], from_lookup[:, None], path_tok], dim=1).tolist()  # 1 sync
        accepted_rows, looked_up = [h[0] for h in host], [bool(h[2]) for h in host]
        finished = self._emit_all([h[3 + W - h[0] :] + [h[1]] for h in host], accepted_rows, looked_up)
        self.stats.steps += 1

        # 4. compact: the target cache keeps the accepted paths; their features go to the draft
        A = max(h[0] for h in host) + 1
        slots = path[:, W - A :]  # (b, A) right-aligned, -1 = hole (a row that accepted fewer)
        valid = slots >= 0
        slots = slots.clamp(min=0)
        kept = feats.gather(1, slots[:, :, None].expand(b, A, feats.shape[-1]))
        after = torch.cat([path_tok[:, W - A + 1 :], bonus[:, None]], dim=1)  # the token after each slot
        self._advance(finished, slots, valid, q_pos.gather(1, slots), kept, after, accepted + 1, bonus)
        return accepted_rows, looked_up

    def plain_step(self) -> tuple[list[int], list[bool]]:
        """A step without a tree: one token per row through the same verification, chosen as plain decoding chooses
        it (no walk over an empty tree: a batch that stopped drafting runs at the same forward's pace)."""
        b = len(self.rows)
        none = torch.zeros(b, 0, dtype=torch.long, device=self.device)
        tree = Tree.build(self.root, none, none, none, None, 0)
        logits, feats, _, q_pos = self.verifier.verify(tree, self.next_pos, self.verifier.logits_rows(tree))
        for r in self.rows:
            self.forwards[r] += 1
        empty = none[0]
        token = self.processing.next_token(logits[:, -1], lambda: [self._history(i, empty) for i in range(b)])
        finished = self._emit_all([[t] for t in token.tolist()], [0] * b, [False] * b)
        self.stats.steps += 1
        valid = torch.ones(b, 1, dtype=torch.bool, device=self.device)
        slots = torch.zeros(b, 1, dtype=torch.long, device=self.device)
        self._advance(finished, slots, valid, q_pos, feats, token[:, None], 1, token)
        return [0] * b, [False] * b

    # ------------------------------------------------------------------ helpers
    def _advance(
        self,
        finished: list[int],
        slots: torch.Tensor,
        valid: torch.Tensor,
        positions: torch.Tensor,
        feats: torch.Tensor,
        after: torch.Tensor,
        advance,
        root: torch.Tensor,
    ) -> None:
        """End a step: the target cache keeps ``slots`` (b, A) where ``valid``, the draft queues their features with
        the token after each, every row moves ``advance`` positions on to ``root``, and finished rows leave."""
        if len(finished) == len(self.rows):
            self.rows = []
            return
        self.verifier.commit(slots, valid, positions)
        self.drafter.queue(feats, after, positions, valid)
        self.next_pos = self.next_pos + advance
        self.root = root
        self._drop_rows(finished)

    def _lookup_chain(self, lookup: int) -> tuple[torch.Tensor | None, list[bool] | None]:
        """(b, m) the lookup branch's tokens per row, padded (a padding token is verified like any other guess), and
        per row whether it proposed any; (None, None) when no row did."""
        chains = [self.lookups[r].propose(lookup) for r in self.rows] if lookup >= 1 else []
        m = max((len(c) for c in chains), default=0)
        if not m:
            return None, None
        chain = torch.tensor([c + [self.pad_id] * (m - len(c)) for c in chains], device=self.device)
        return chain, [bool(c) for c in chains]

    def _history(self, i: int, extra: torch.Tensor) -> torch.Tensor:
        """Active row i's tokens so far plus ``extra``, (1, len)."""
        ids = self.tokens[self.rows[i]] + extra.tolist()
        return torch.tensor([ids], dtype=torch.long, device=self.device)

    def _emit(self, row: int, new: list[int]) -> tuple[list[int], bool]:
        """Append ``new`` to ``row`` up to the first stop condition: (tokens taken, row finished)."""
        tokens = self.tokens[row]
        taken = []
        done = False
        for tok in new:
            tokens.append(tok)
            taken.append(tok)
            self.generated[row] += 1
            if tok in self.eos or self.generated[row] >= self.max_new_tokens:
                done = True
            elif self.criteria:
                ids = torch.tensor([tokens], dtype=torch.long)
                done = any(bool(c(ids, None).any()) for c in self.criteria)
            if done:
                break
        return taken, done

    def _emit_all(self, new: list[list[int]], from_draft: list[int], looked_up: list[bool]) -> list[int]:
        """Emit each active row's new tokens (``from_draft`` of them accepted from the tree, from the lookup branch
        where ``looked_up``), stream them, and return the active indices of the rows that finished."""
        emitted, drafted, finished = {}, {}, []
        for i, r in enumerate(self.rows):
            taken, done = self._emit(r, new[i])
            emitted[r], drafted[r] = taken, min(from_draft[i], len(taken))
            if looked_up[i]:
                self.stats.lookup_accepted += drafted[r]
            self.stats.accepted_per_step.append(len(taken))
            if done:
                finished.append(i)
        if self.streamer is not None and emitted.get(0):
            self.streamer.put(torch.tensor(emitted[0], dtype=torch.long))
        if self.on_step is not None:
            rows = range(len(self.tokens))
            self.on_step([emitted.get(r, []) for r in rows], [drafted.get(r, 0) for r in rows])
        return finished

    def _drop_rows(self, finished: list[int]):
        if not finished:
            return
        gone = set(finished)
        n = len(self.rows) - len(gone)
        # the last rows still decoding take the places of the finished ones: the caches move a row per finished row,
        # not every row after it (a row's place in the batch means nothing; its original index goes with it)
        keep = list(range(n))
        freed = [i for i in range(n) if i in gone]
        for place, row in zip(freed, [i for i in range(n, len(self.rows)) if i not in gone]):
            keep[place] = row
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.verifier.select_rows(idx)
        self.drafter.select_rows(idx)
        self.next_pos = self.next_pos.index_select(0, idx)
        self.root = self.root.index_select(0, idx)
