"""Building the draft tree: the draft reads the accepted tokens' target features, then expands the tree one level
per draft forward, and the most probable nodes of the pool form the tree.

The root is a row's latest token (sampled from the target, not yet in its cache). The draft's first forward over
the tokens accepted in the last step yields the root's children; each further level feeds the k best frontier
nodes by cumulative draft log-probability (each with its parent's draft hidden state), and each proposes its k best
children. Of the pool of ``k + (depth - 1) * k * k`` candidates the ``total_tokens`` best form the tree, which is
ancestor-closed because a child always scores below its parent.

When sampling with ``draft_sampling``, each node's children are instead a sample of the draft's distribution (at
``DRAW_TEMPERATURE_SHARE`` of the sampling temperature), drawn without replacement (Gumbel-top-k), and the j-th draw
scores as the j-th most probable child would: the parent's score plus the j-th largest draft log-probability. A
node's scores then depend on its parent's distribution only, not on which tokens were drawn, and fall with the draw
order; the tree (the best ``total_tokens``, ties to the earlier draw) keeps a prefix of each node's draws, of a
length that says nothing of their tokens: what recursive rejection sampling needs to stay lossless
(``acceptance.proposal_level``). The shapes, the pruning and the adaptive tree's costs are those of the top-k tree.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .caches import ScratchCache, TreeKVCache
from .config import TreeConfig
from .fast_paths import int8_draft, packed_head
from .masks import additive_mask, layer_type_masks
from .outputs import TreeDecodingStats
from .verification import Proposal

# A tree after steps without one reads at most this many of their latest tokens per row: the draft reads what the
# target just wrote, and a longer catch-up would cost each trial of a tree after a long run without one a draft
# forward over all of it. The positions it leaves out are absent from the draft's cache, as a hole is.
CATCH_UP_TOKENS = 8

# With draft_sampling the children are drawn at this share of the sampling temperature: a draft is less sure than
# its target, and its sharper distribution covers more of the target's (SmolLM2's reference draft on unseen prompts,
# T=0.7 and 1: 0.6-0.8 the best of 0.4-1.0; docs/benchmarks.md, "Children drawn from the draft").
DRAW_TEMPERATURE_SHARE = 0.6


class Drafter:
    """The draft model's side of a run: its context cache (context positions only), the accepted tokens' features
    waiting to be read (``pending``, the latest CATCH_UP_TOKENS or so), and the tree built from them. Shapes: b rows,
    k = tree_top_k, H draft hidden."""

    def __init__(self, draft, target, config: TreeConfig, stats: TreeDecodingStats):
        if config.draft_int8:
            fast = int8_draft(draft)
            if fast is None:
                raise ValueError(
                    "draft_int8 needs a float32 draft on a CPU and torch's quantized int8 kernels (fbgemm); this draft "
                    f"is {draft.dtype} on {draft.device}: set draft_int8=False."
                )
            draft = fast  # a copy sharing the draft's weights; its head is int8 too, so packed_head below declines it
        self.draft, self.stats = draft, stats
        self.top_k, self.total_tokens = config.tree_top_k, config.total_tokens
        self.min_node_logp = math.log(config.min_node_prob) if config.min_node_prob > 0 else None
        # a further level is drafted only while a frontier node reaches this (the stricter of the two thresholds)
        grow = max(config.min_node_prob, config.grow_min_prob)
        self.grow_logp = math.log(grow) if grow > 0 else None
        t_embed = target.get_input_embeddings()
        self.device = t_embed.weight.device
        self.dtype = draft.lm_head.weight.dtype
        # the draft's token embedding: its own, or the target's when it was saved without one
        if getattr(draft, "_embedding_missing", False) and not getattr(draft, "_embedding_from_target", False):
            self.embed = t_embed.weight[: draft.config.vocab_size]
        else:
            self.embed = draft.embed_tokens.weight
        self.d2t = draft.d2t.to(self.device)
        cfg = draft.config
        self.num_layers = cfg.num_hidden_layers
        # sliding-window draft layers: every forward gets explicit masks over the key positions (a catch-up that
        # leaves positions out makes slot index and position differ)
        self.window = cfg.sliding_window if "sliding_attention" in cfg.layer_types else None
        # the draft's logits through a packed copy of its head where oneDNN can: the draft then computes none
        # itself, and forward() applies its final norm and this head to the kept positions
        self.head = packed_head(draft.lm_head) if isinstance(getattr(draft, "norm", None), torch.nn.Module) else None
        # the tree levels on fixed shapes: one CUDA graph per shape on CUDA
        self.levels = DraftLevels(capture=self.device.type == "cuda") if config.draft_graph else None
        self.sampling: tuple[float, torch.Generator | None] | None = None  # (temperature, generator): draft_sampling
        self.proposal: Proposal | None = None  # the last sampled tree's draft distributions

    def sample_with(self, temperature: float, generator: torch.Generator | None):
        """Draw each node's children from the draft's distribution at ``DRAW_TEMPERATURE_SHARE`` of the sampling
        ``temperature`` (module docstring)."""
        self.sampling = (temperature * DRAW_TEMPERATURE_SHARE, generator)
        target_ids = self.draft.draft_to_target_ids(torch.arange(self.d2t.numel(), device=self.device))
        self.draft_of = torch.full((int(target_ids.max()) + 1,), -1, dtype=torch.long, device=self.device)
        self.draft_of[target_ids] = torch.arange(target_ids.numel(), device=self.device)

    def start(self, b: int, capacity: int):
        self.cache = TreeKVCache(self.num_layers, capacity)
        self.valid = torch.zeros(b, 0, dtype=torch.bool, device=self.device)  # (b, Td) context slots that are tokens
        self.pos = torch.zeros(b, 0, dtype=torch.long, device=self.device)  # (b, Td) their positions
        self.pending: list[tuple] = []  # (features, tokens, positions, valid) of each step, oldest first
        self.root_out = None  # the last read's draft logits (b, Vd) and hidden state (b, 1, H) at each row's root

    def queue(self, feats, tokens, positions, valid):
        """The accepted slots' target features (b, A, F), each with the token after it, for the next tree; after
        those of steps without a tree, which the draft has not read yet (kept as they came: joined once, when read),
        of which the oldest steps leave once the newer hold CATCH_UP_TOKENS."""
        self.pending.append((feats, tokens, positions, valid))
        while len(self.pending) > 1 and sum(step[1].shape[1] for step in self.pending[1:]) >= CATCH_UP_TOKENS:
            self.pending.pop(0)

    @property
    def unread(self) -> bool:
        return bool(self.pending)

    def waiting(self) -> tuple:
        """What the next read takes: the queued steps' (features, tokens, positions, valid), joined in order."""
        if len(self.pending) > 1:
            self.pending = [tuple(torch.cat(parts, dim=1) for parts in zip(*self.pending))]
        return self.pending[0]

    def select_rows(self, idx: torch.Tensor):
        self.cache.select_rows(idx)
        self.valid = self.valid.index_select(0, idx)
        self.pos = self.pos.index_select(0, idx)
        self.pending = [tuple(t.index_select(0, idx) for t in self.waiting())] if self.pending else []
        if self.root_out is not None:
            self.root_out = tuple(t.index_select(0, idx) for t in self.root_out)

    # ------------------------------------------------------------------ forwards
    def forward(self, tokens, position_ids, allowed, *, features=None, hidden=None, logits_to_keep=0, cache=None, key_pos=None):
        """``allowed``: (b, s, kv) bool, or None for causal attention over the whole draft cache. ``cache``: the
        context cache by default. ``key_pos`` (b, kv): the positions of the keys (sliding-window drafts)."""
        own_head = self.head is not None
        if allowed is None:
            mask = None
        elif self.window is None:
            mask = additive_mask(allowed, self.dtype)
        else:
            mask = layer_type_masks(allowed, self.dtype, self.window, position_ids, key_pos)
        out = self.draft(
            inputs_embeds=F.embedding(tokens, self.embed),
            target_hidden_states=features,
            hidden_states=hidden,
            position_ids=position_ids,
            attention_mask=mask,
            cache=self.cache if cache is None else cache,
            use_cache=True,
            # with the packed head: a (b, s) mask that keeps no position, so the draft computes no logits
            logits_to_keep=torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device) if own_head else logits_to_keep,
        )
        self.stats.draft_forwards += 1
        if not own_head:
            return out.logits, out.hidden_states
        kept = out.hidden_states[:, -logits_to_keep:] if logits_to_keep else out.hidden_states
        return self.head(self.draft.norm(kept)), out.hidden_states

    def children(self, parent_score: torch.Tensor, logits: torch.Tensor, uniform: torch.Tensor | None = None):
        """parent_score (...), logits (..., Vd) -> (scores (..., k), draft ids (..., k), the log-probabilities they were
        drawn from (..., Vd), None for the top-k) of each node's k children. ``uniform`` (..., Vd): the draws' uniform
        noise, drawn here when None (``DraftLevels`` draws it outside its CUDA graph)."""
        child_logp, ids = self.log_probs(logits).topk(self.top_k, dim=-1)
        if self.sampling is None:
            return parent_score[..., None] + child_logp, ids, None
        temperature, generator = self.sampling
        logq = torch.log_softmax(logits.float() / temperature, dim=-1)
        if uniform is None:
            uniform = torch.rand(logq.shape, device=logq.device, generator=generator)
        u = uniform.clamp_(1e-20, 1.0 - 1e-7)  # in place: fresh noise, or DraftLevels' buffer, filled anew each call
        ids = (logq - torch.log(-torch.log(u))).topk(self.top_k, dim=-1).indices  # log q + Gumbel: draws in order
        return parent_score[..., None] + child_logp, ids, logq

    @staticmethod
    def log_probs(logits: torch.Tensor) -> torch.Tensor:
        # strictly negative, so a child always scores below its parent (the selected tree is ancestor-closed)
        return torch.log_softmax(logits.float(), dim=-1).clamp_max(-1e-4)

    # ------------------------------------------------------------------ the tree
    def read(self, holes: bool):
        """Read the pending features into the draft's context cache (``holes``: rows with masked slots), keeping the
        draft's output at each row's root for the next tree."""
        feats, tokens, positions, valid = self.waiting()
        self.pending = []
        b, A = tokens.shape
        allowed = None  # causal over the whole draft context
        if holes or self.window is not None:
            causal = torch.ones(A, A, dtype=torch.bool, device=self.device).tril()
            allowed = torch.cat(
                [self.valid[:, None, :].expand(b, A, self.cache.length), causal[None] & valid[:, None, :]], dim=-1
            )
        key_pos = torch.cat([self.pos, positions], dim=1)
        logits, hidden = self.forward(tokens, positions, allowed, features=feats, logits_to_keep=1, key_pos=key_pos)
        self.cache.commit()
        self.valid = torch.cat([self.valid, valid], dim=1)
        self.pos = key_pos
        self.root_out = (logits[:, -1], hidden[:, -1:])

    def draft_tree(
        self,
        depth: int,
        next_pos: torch.Tensor,
        holes: bool,
        top_k: int | None = None,
        total_tokens: int | None = None,
        row_depth: torch.Tensor | None = None,
    ):
        """Read the pending features (``read``), then build a tree of up to ``depth`` levels under each row's root (at
        position ``next_pos`` (b,)). Returns node tokens (b, N) (target ids), parent slots (b, N) (0 = root, node i is
        slot i+1) and depths (b, N); parents precede their children. ``top_k`` / ``total_tokens``: this step's (default:
        the config's); ``row_depth`` (b,): each row's nodes from its first ``row_depth`` levels only."""
        if top_k is not None:
            self.top_k, self.total_tokens = top_k, total_tokens
        if self.unread:
            self.read(holes)
        logits, root_hidden = self.root_out
        score, draft_ids, root_q = self.children(logits.new_zeros(logits.shape[0], dtype=torch.float32), logits)
        token = draft_ids + self.d2t[draft_ids]  # (b, k): the root's children
        if self.levels is not None:  # fixed shapes (a CUDA graph on CUDA)
            return self.levels(self, depth, score, token, root_hidden, next_pos, root_q)
        # a node at depth d comes with its d - 1 ancestors, so no node past depth total_tokens can be selected: those
        # levels are not drafted (the same tree)
        depth = min(depth, self.total_tokens)
        tree = self.grow(
            depth, score, token, root_hidden, self.valid[:, None, :], self.cache, next_pos, row_depth, self.pos, root_q
        )
        self.cache.rollback()  # the tree's draft slots are not context
        return tree

    def can_grow(self, f_score: torch.Tensor) -> bool:
        """Whether to draft a further level: not when every frontier node (b, k) scores below min_node_prob (a child
        always scores below its parent, so the level could add no node) or below grow_min_prob (its nodes would
        rarely be accepted). One sync; never with draft_graph."""
        return self.grow_logp is None or bool((f_score >= self.grow_logp).any())

    def grow(
        self,
        depth,
        score,
        token,
        root_hidden,
        ctx_allowed,
        cache,
        next_pos,
        row_depth=None,
        ctx_pos=None,
        root_q=None,
        uniform=None,
    ):
        """Levels 2..depth of the tree from the root's k children (score, token: (b, k); root_hidden (b, 1, H)),
        then the best ``total_tokens`` nodes of the pool. ``ctx_allowed`` (b, 1, C): the draft context slots of
        ``cache`` each row may read, at positions ``ctx_pos`` (b, C); the levels append their slots to ``cache``
        after them. ``row_depth`` (b,): a row takes its nodes from its first ``row_depth`` levels only (they must
        hold ``total_tokens``). ``root_q`` (b, Vd): the root's draft log-probabilities when the children are sampled;
        ``self.proposal`` then holds those of every expanded node. ``uniform`` (depth - 1, b, k, Vd): the noise of
        each level's draws (``children``)."""
        dev = self.device
        b, k = score.shape
        H = root_hidden.shape[-1]
        pool_score, pool_tok = [score], [token]
        pool_parent = [None]  # the root's children: "parent = root", set once the pool's size is known
        # frontier: nodes fed to the next draft forward
        f_score, f_tok = score, token
        f_hidden = root_hidden.expand(b, k, H)
        f_index = torch.arange(k, device=dev).expand(b, k)  # pool index
        f_anc = torch.zeros(b, k, 0, dtype=torch.bool, device=dev)  # ancestors among the fed tree slots
        eye_k = torch.eye(k, dtype=torch.bool, device=dev).expand(b, k, k)
        offset = k
        key_pos = ctx_pos  # positions of the slots the next level reads (sliding-window drafts)
        sampled_q = [] if root_q is None else [root_q[:, None]]  # the expanded nodes' draft log-probabilities
        sampled_at = []  # ...and the pool indices of those below the root

        # one draft forward per further level
        for lvl in range(2, depth + 1):
            if not self.can_grow(f_score):
                break  # the tree it would add to is already complete
            anc_self = torch.cat([f_anc, eye_k], dim=-1)  # (b, k, (lvl-1)*k)
            allowed = torch.cat([ctx_allowed.expand(b, k, ctx_allowed.shape[-1]), anc_self], dim=-1)
            f_pos = (next_pos + lvl - 2)[:, None].expand(b, k)  # a depth-d node sits at root pos + d - 1
            if self.window is not None:
                key_pos = torch.cat([key_pos, f_pos], dim=1)
            logits, hidden = self.forward(f_tok, f_pos, allowed, hidden=f_hidden, cache=cache, key_pos=key_pos)
            child_score, child_ids, logq = self.children(f_score, logits, None if uniform is None else uniform[lvl - 2])
            if logq is not None:
                sampled_q.append(logq)
                sampled_at.append(f_index)
            c_score = child_score.reshape(b, k * k)
            c_tok = (child_ids + self.d2t[child_ids]).reshape(b, k * k)
            pool_score.append(c_score)
            pool_tok.append(c_tok)
            pool_parent.append(f_index[:, :, None].expand(b, k, k).reshape(b, k * k))
            if lvl < depth:
                best = c_score.topk(k, dim=-1).indices  # (b, k) next frontier
                parent_j = best // k
                f_score = c_score.gather(1, best)
                f_tok = c_tok.gather(1, best)
                f_hidden = hidden.gather(1, parent_j[:, :, None].expand(b, k, H))
                f_anc = anc_self.gather(1, parent_j[:, :, None].expand(b, k, anc_self.shape[-1]))
                f_index = offset + best
            offset += k * k

        # the best total_tokens nodes of the pool by cumulative log-probability
        pool_score = torch.cat(pool_score, dim=1)  # (b, P)
        P = pool_score.shape[1]
        pool_parent[0] = torch.full((b, k), P, dtype=torch.long, device=dev)  # index P = the root
        pool_depth = torch.cat(
            [torch.ones(k, dtype=torch.long, device=dev)]
            + [torch.full((k * k,), d, dtype=torch.long, device=dev) for d in range(2, len(pool_tok) + 1)]
        )
        if row_depth is not None:  # a row's deeper candidates are never selected: its nodes go nearer its root
            pool_score = pool_score.masked_fill(pool_depth[None, :] > row_depth[:, None], float("-inf"))
        N = min(self.total_tokens, P)
        if self.min_node_logp is not None:  # fewer nodes where the draft gives the rest little chance (one sync)
            N = max(1, min(N, int((pool_score >= self.min_node_logp).sum(-1).max())))
        # ties to the earlier pool index: a node's kept draws stay a prefix of its draws (module docstring)
        selected = pool_score.neg().sort(dim=-1, stable=True).indices[:, :N].sort(dim=-1).values  # (b, N), parents first
        slot_of = torch.full((b, P + 1), -1, dtype=torch.long, device=dev)  # pool index -> node index
        slot_of.scatter_(1, selected, torch.arange(N, device=dev).expand(b, N))
        parent_pool = torch.cat(pool_parent, dim=1).gather(1, selected)
        node_parent = slot_of.gather(1, parent_pool) + 1  # slot of the parent, root = 0
        node_tok = torch.cat(pool_tok, dim=1).gather(1, selected)
        node_depth = pool_depth[selected]
        if root_q is not None:  # each slot's row among the expanded nodes' distributions (-1: a leaf)
            row_of = torch.full((b, P + 1), -1, dtype=torch.long, device=dev)
            row_of[:, P] = 0
            for i, at in enumerate(sampled_at):
                row_of.scatter_(1, at, (1 + i * k + torch.arange(k, device=dev)).expand(b, k))
            slot_rows = row_of.gather(1, torch.cat([torch.full((b, 1), P, device=dev), selected], dim=1))
            self.proposal = Proposal(torch.cat(sampled_q, dim=1), slot_rows, self.draft_of)
        return node_tok, node_parent, node_depth


class DraftLevels:
    """Levels 2..depth of the draft tree over fixed-shape buffers (``Drafter.grow`` with a ``ScratchCache`` and the
    context's validity over the whole buffer). With ``capture`` (CUDA) they run as one CUDA graph per (rows, depth,
    context buffer), captured at first use and replayed afterwards: a level is ~30 small kernels whose launches, not
    their work, cost the time at batch 1. Without ``capture`` the same fixed-shape code runs eagerly (its test on
    CPU). Drawn children (``draft_sampling``) take their uniform noise from a static buffer filled before each
    replay, so each tree is drawn anew."""

    def __init__(self, capture: bool):
        self.capture = capture
        self.entries: dict[tuple, tuple] = {}

    def __call__(self, drafter: Drafter, depth: int, score, token, root_hidden, next_pos, root_q=None):
        ctx = drafter.cache
        b, k = score.shape
        drawn = root_q is not None
        key = (b, depth, k, drafter.total_tokens, drawn, ctx.buffer.data_ptr(), ctx.buffer.shape[4])
        if key not in self.entries:  # those of an old context buffer or of more rows are not used again
            self.entries = {e: v for e, v in self.entries.items() if e[5:] == key[5:] and e[0] == b}
            static = {
                "score": score.clone(),
                "token": token.clone(),
                "hidden": root_hidden.clone(),
                "valid": torch.zeros(b, ctx.buffer.shape[4], dtype=torch.bool, device=score.device),
                "ctx_pos": torch.zeros(b, ctx.buffer.shape[4], dtype=torch.long, device=score.device),
                "pos": next_pos.clone(),
            }
            if drawn:
                static["root_q"] = root_q.clone()
                static["uniform"] = root_q.new_empty(depth - 1, b, k, root_q.shape[-1])
            self.entries[key] = (static, ScratchCache(ctx, (depth - 1) * k), None, None)
        static, scratch, graph, out = self.entries[key]
        static["score"].copy_(score)
        static["token"].copy_(token)
        static["hidden"].copy_(root_hidden)
        static["valid"][:, : ctx.length] = drafter.valid
        static["valid"][:, ctx.length :] = False
        static["ctx_pos"][:, : ctx.length] = drafter.pos
        static["pos"].copy_(next_pos)
        if drawn:
            static["root_q"].copy_(root_q)
            static["uniform"].uniform_(generator=drafter.sampling[1])
        forwards = drafter.stats.draft_forwards

        def levels():
            scratch.reset()
            tree = drafter.grow(
                depth,
                static["score"],
                static["token"],
                static["hidden"],
                static["valid"][:, None, :],
                scratch,
                static["pos"],
                None,
                static["ctx_pos"],
                static.get("root_q"),
                static.get("uniform"),
            )
            return (*tree, drafter.proposal.log_q, drafter.proposal.slot_rows) if drawn else tree

        if not self.capture:
            out = levels()
        elif graph is None:
            side = torch.cuda.Stream(device=score.device)
            side.wait_stream(torch.cuda.current_stream(score.device))
            with torch.cuda.stream(side):  # warm-up outside the graph (library handles, workspaces)
                levels()
            torch.cuda.current_stream(score.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = levels()
            self.entries[key] = (static, scratch, graph, out)
            graph.replay()
        else:
            graph.replay()
        drafter.stats.draft_forwards = forwards + depth - 1
        out = tuple(t.clone() for t in out)  # the graph's outputs are overwritten by its next replay
        if drawn:
            drafter.proposal = Proposal(out[3], out[4], drafter.draft_of)
        return out[:3]
