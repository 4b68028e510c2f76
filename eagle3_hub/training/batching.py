"""Batches for training: right-padded collation, batches of samples of similar length (less padding), and packed
batches (several samples concatenated in a row, each a document of its own), in an order that is a function of the
seed alone, so that a resumed run replays the same batches."""

from __future__ import annotations

from functools import partial

import torch
from torch.utils.data import DataLoader


def collate(batch: list[dict], pad_id: int) -> dict:
    """Right-padded batch: input_ids, attention_mask, loss_mask (b, s), and the sample indices."""
    s = max(len(ex["input_ids"]) for ex in batch)
    ids = torch.full((len(batch), s), pad_id, dtype=torch.long)
    att = torch.zeros((len(batch), s), dtype=torch.long)
    lm = torch.zeros((len(batch), s), dtype=torch.long)
    for i, ex in enumerate(batch):
        n = len(ex["input_ids"])
        ids[i, :n] = torch.tensor(ex["input_ids"])
        att[i, :n] = 1
        lm[i, :n] = torch.tensor(ex["loss_mask"])
    return {"input_ids": ids, "attention_mask": att, "loss_mask": lm, "index": torch.tensor([ex["index"] for ex in batch])}


class LengthGroupedBatches(torch.utils.data.Sampler):
    """Batches of samples of similar length, in random order: less padding, so less work per token.

    Each epoch shuffles all samples with ``generator``, cuts them into groups of ``group`` batches, sorts
    each group by length, and shuffles the batches. Like transformers' ``group_by_length``; deterministic
    given the generator's state, so a resumed run replays the same batches."""

    def __init__(self, lengths: list[int], batch_size: int, generator: torch.Generator, group: int = 32):
        self.lengths, self.batch_size, self.generator, self.group = lengths, batch_size, generator, group

    def __len__(self) -> int:
        return (len(self.lengths) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        span = self.batch_size * self.group
        batches = []
        for start in range(0, len(order), span):
            chunk = sorted(order[start : start + span], key=lambda i: -self.lengths[i])
            batches += [chunk[b : b + self.batch_size] for b in range(0, len(chunk), self.batch_size)]
        for b in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[b]


def pack_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: the indices of ``lengths`` in rows of at most ``capacity`` tokens (a longer sample alone)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = next((r for r, free in enumerate(room) if lengths[i] <= free), None)
        if r is None:
            rows.append([i])
            room.append(capacity - lengths[i])
        else:
            rows[r].append(i)
            room[r] -= lengths[i]
    return rows


def collate_packed(batch: list[dict], pad_id: int, capacity: int) -> dict:
    """Samples packed into rows of at most ``capacity`` tokens: input_ids, attention_mask, loss_mask, position_ids
    (restarting at each sample) and document_ids (1, 2, ... per sample of a row, 0 on padding), (rows, s); and per
    sample its index and where it lies: doc_row, doc_start, doc_length (n,)."""
    rows = pack_rows([len(ex["input_ids"]) for ex in batch], capacity)
    s = max(sum(len(batch[i]["input_ids"]) for i in row) for row in rows)
    ids = torch.full((len(rows), s), pad_id, dtype=torch.long)
    att, lm, pos, doc = (torch.zeros((len(rows), s), dtype=torch.long) for _ in range(4))
    index, where = [], []
    for r, row in enumerate(rows):
        start = 0
        for d, i in enumerate(row, 1):
            ex, n = batch[i], len(batch[i]["input_ids"])
            ids[r, start : start + n] = torch.tensor(ex["input_ids"])
            att[r, start : start + n] = 1
            lm[r, start : start + n] = torch.tensor(ex["loss_mask"])
            lm[r, start] = 0  # nothing in the sample precedes its first token: the row before it belongs to another
            pos[r, start : start + n] = torch.arange(n)
            doc[r, start : start + n] = d
            index.append(ex["index"])
            where.append((r, start, n))
            start += n
    row_, start_, length_ = torch.tensor(where).T
    return {
        "input_ids": ids,
        "attention_mask": att,
        "loss_mask": lm,
        "position_ids": pos,
        "document_ids": doc,
        "index": torch.tensor(index),
        "doc_row": row_,
        "doc_start": start_,
        "doc_length": length_,
    }


def unpack_batch(batch: dict) -> dict:
    """A packed batch as the right-padded batch of its samples (input_ids, attention_mask, loss_mask, index)."""
    n, s = len(batch["index"]), int(batch["doc_length"].max())
    out = {k: batch[k].new_zeros((n, s)) for k in ("input_ids", "attention_mask", "loss_mask")}
    for j, (r, start, length) in enumerate(zip(*(batch[k].tolist() for k in ("doc_row", "doc_start", "doc_length")))):
        for k in out:
            out[k][j, :length] = batch[k][r, start : start + length]
    out["index"] = batch["index"]
    return out


def pack_like(x: torch.Tensor, batch: dict) -> torch.Tensor:
    """Per-sample values (n, s', ...) of ``unpack_batch(batch)`` laid out as the packed rows of ``batch`` (zeros on
    padding)."""
    out = x.new_zeros(batch["input_ids"].shape + x.shape[2:])
    for j, (r, start, length) in enumerate(zip(*(batch[k].tolist() for k in ("doc_row", "doc_start", "doc_length")))):
        out[r, start : start + length] = x[j, :length]
    return out


class PackedBatches(torch.utils.data.Sampler):
    """Batches of samples that fill ``rows`` rows of ``capacity`` tokens, in random order.

    Each epoch shuffles all samples with ``generator``, packs each span of ``span`` samples into rows
    (``pack_rows``), takes the rows ``rows`` at a time, and shuffles the batches; ``collate_packed`` packs each
    batch's samples again the same way. Deterministic given the generator's state, so a resumed run replays the
    same batches."""

    def __init__(self, lengths: list[int], rows: int, capacity: int, generator: torch.Generator, span: int = 1024):
        self.lengths, self.rows, self.capacity, self.generator, self.span = lengths, rows, capacity, generator, span

    def _batches(self, generator: torch.Generator) -> list[list[int]]:
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        batches = []
        for start in range(0, len(order), self.span):
            chunk = order[start : start + self.span]
            packed = pack_rows([self.lengths[i] for i in chunk], self.capacity)
            for b in range(0, len(packed), self.rows):
                batches.append([chunk[i] for row in packed[b : b + self.rows] for i in row])
        return batches

    def __len__(self) -> int:  # of the epoch the generator's seed gives (others differ by a batch or so)
        return len(self._batches(torch.Generator().manual_seed(self.generator.initial_seed())))

    def __iter__(self):
        batches = self._batches(self.generator)
        for b in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[b]


def make_loaders(train_ds, eval_ds, t: dict, pad_id: int, accelerator) -> tuple[DataLoader, DataLoader, torch.Generator]:
    """The train loader (shuffled; packed with ``train.packing``, else length-grouped with ``train.group_by_length``)
    and the held-out loader (in order, one sample a row), prepared for the processes, and the generator of the train
    shuffle (the loop reseeds it each epoch)."""
    generator = torch.Generator().manual_seed(t["seed"])
    pad = partial(collate, pad_id=pad_id)
    lengths = [len(x) for x in train_ds["input_ids"]]
    if t["packing"]:
        capacity = t["pack_tokens"] or max(lengths)
        sampler = PackedBatches(lengths, t["batch_size"], capacity, generator)
        train_loader = DataLoader(
            train_ds, batch_sampler=sampler, collate_fn=partial(collate_packed, pad_id=pad_id, capacity=capacity)
        )
    elif t["group_by_length"]:
        sampler = LengthGroupedBatches(lengths, t["batch_size"], generator)
        train_loader = DataLoader(train_ds, batch_sampler=sampler, collate_fn=pad)
    else:
        train_loader = DataLoader(train_ds, batch_size=t["batch_size"], shuffle=True, generator=generator, collate_fn=pad)
    eval_loader = DataLoader(eval_ds, batch_size=t["batch_size"], shuffle=False, collate_fn=pad)
    train_loader, eval_loader = accelerator.prepare(train_loader, eval_loader)
    return train_loader, eval_loader, generator
