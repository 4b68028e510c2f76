"""Batches for training: right-padded collation, and batches of samples of similar length (less padding) in an order
that is a function of the seed alone, so that a resumed run replays the same batches."""

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
            chunk = sorted(order[start:start + span], key=lambda i: -self.lengths[i])
            batches += [chunk[b:b + self.batch_size] for b in range(0, len(chunk), self.batch_size)]
        for b in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[b]


def make_loaders(train_ds, eval_ds, t: dict, pad_id: int, accelerator) -> tuple[DataLoader, DataLoader, torch.Generator]:
    """The train loader (shuffled, length-grouped with ``train.group_by_length``) and the held-out loader (in order),
    prepared for the processes, and the generator of the train shuffle (the loop reseeds it each epoch)."""
    generator = torch.Generator().manual_seed(t["seed"])
    pad = partial(collate, pad_id=pad_id)
    if t["group_by_length"]:
        sampler = LengthGroupedBatches([len(x) for x in train_ds["input_ids"]], t["batch_size"], generator)
        train_loader = DataLoader(train_ds, batch_sampler=sampler, collate_fn=pad)
    else:
        train_loader = DataLoader(train_ds, batch_size=t["batch_size"], shuffle=True, generator=generator, collate_fn=pad)
    eval_loader = DataLoader(eval_ds, batch_size=t["batch_size"], shuffle=False, collate_fn=pad)
    train_loader, eval_loader = accelerator.prepare(train_loader, eval_loader)
    return train_loader, eval_loader, generator
