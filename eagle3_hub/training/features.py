"""Target features for training: the three aux-layer outputs and the target's logits.

online: a target forward inside each training step.
offline: one pass writes safetensors shards (bf16) of the aux features and the target's final hidden state;
training reads them and applies the target's ``lm_head``. Resumable shard by shard, size estimated first,
and a clear stop when the disk would fill. A later training stage can take the features of samples an earlier
run already computed (``features.reuse_from``) and compute only its new samples.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..extras import missing_extra

try:
    from datasets import load_from_disk
except ModuleNotFoundError as e:
    raise missing_extra("train", e) from None

from ..atomic import atomic_path, atomic_write_json
from .batching import pack_like, unpack_batch
from .ttt import TargetScores, draft_token_ids, target_logit_positions


@torch.no_grad()
def aux_features(
    target,
    input_ids,
    attention_mask,
    aux_layer_ids,
    logits_at: torch.Tensor | None = None,
    draft_ids: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | TargetScores]:
    """(b, s, 3*H) aux features (outputs of the aux decoder layers) and the target's logits: (b, s, V), or their
    ``TargetScores`` when ``draft_ids`` (the draft vocabulary's target ids) is given.

    logits_at: (b, s) bool, the positions whose logits are wanted (``ttt.target_logit_positions``); the others
    are left at 0. The target's output layer over its full vocabulary is then run on those rows only.

    position_ids: of packed rows (restarting at each sample), with ``attention_mask`` None: transformers then keeps
    attention within each sample."""
    if position_ids is not None:
        out = target(
            input_ids=input_ids,
            position_ids=position_ids,
            output_hidden_states=True,
            use_cache=False,
            logits_to_keep=no_logits(input_ids.device),
        )
        aux = torch.cat([out.hidden_states[i + 1] for i in aux_layer_ids], dim=-1)
        return aux, target_logits(target, out.hidden_states[-1], logits_at, draft_ids)
    if logits_at is None and draft_ids is None:
        out = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
        return torch.cat([out.hidden_states[i + 1] for i in aux_layer_ids], dim=-1), out.logits
    out = target(
        input_ids=input_ids,
        attention_mask=attention_mask,
        output_hidden_states=True,
        use_cache=False,
        logits_to_keep=no_logits(input_ids.device),
    )
    aux = torch.cat([out.hidden_states[i + 1] for i in aux_layer_ids], dim=-1)
    return aux, target_logits(target, out.hidden_states[-1], logits_at, draft_ids)


def no_logits(device) -> torch.Tensor:
    """``logits_to_keep`` for a forward that needs hidden states only. (Not ``1``: torch runs the head on a strided
    (b, 1, H) slice of a frozen model as a batched product that copies the head's weight once per row.)"""
    return torch.zeros(0, dtype=torch.long, device=device)


# rows of the target's head computed at once when only their TargetScores are kept (262k columns: ~1 GB of float32)
SCORE_CHUNK_ROWS = 1024


@torch.no_grad()
def target_logits(
    target, last: torch.Tensor, logits_at: torch.Tensor | None = None, draft_ids: torch.Tensor | None = None
) -> torch.Tensor | TargetScores:
    """(b, s, V) logits from the target's final (normed) hidden state ``last`` (b, s, H), at ``logits_at`` only
    (zeros elsewhere) when it is given; with ``draft_ids``, their ``TargetScores`` instead, computed
    ``SCORE_CHUNK_ROWS`` rows at a time, so that no (b, s, V) tensor is ever made."""
    lm_head = target.get_output_embeddings()
    last = last.to(lm_head.weight.dtype)
    softcap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)

    def head(h):
        logits = lm_head(h)
        return torch.tanh(logits / softcap) * softcap if softcap else logits  # Gemma 2 / 3

    if draft_ids is None:
        if logits_at is None:
            return head(last)
        logits = last.new_zeros(last.shape[:2] + (lm_head.weight.shape[0],))
        logits[logits_at] = head(last[logits_at])
        return logits
    at = torch.ones(last.shape[:2], dtype=torch.bool, device=last.device) if logits_at is None else logits_at
    rows = last[at]  # (n, H)
    b, s = last.shape[:2]
    scores = TargetScores(
        torch.zeros(b, s, draft_ids.numel(), device=last.device),
        torch.zeros(b, s, dtype=torch.long, device=last.device),
        torch.zeros(b, s, device=last.device),
    )
    parts = [
        TargetScores.from_logits(head(rows[i : i + SCORE_CHUNK_ROWS]), draft_ids)
        for i in range(0, rows.shape[0], SCORE_CHUNK_ROWS)
    ]
    if parts:
        scores.draft[at] = torch.cat([p.draft for p in parts])
        scores.argmax[at] = torch.cat([p.argmax for p in parts])
        scores.lse[at] = torch.cat([p.lse for p in parts])
    return scores


def sample_key(input_ids) -> str:
    """A sample's identity in a feature cache: the hash of its token ids."""
    return hashlib.sha1(np.asarray(input_ids, dtype=np.int64).tobytes()).hexdigest()


class ShardReader:
    """Tensors by name across the safetensors shards of one feature cache (handles opened once, on first use)."""

    def __init__(self, folder: Path):
        self.dir, self._where = Path(folder), None

    def get(self, name: str) -> torch.Tensor | None:
        if self._where is None:
            self._where = {}
            for p in sorted(self.dir.glob("split*.safetensors")):
                h = safe_open(str(p), "pt")
                for key in h.keys():
                    self._where[key] = h
        h = self._where.get(name)
        return None if h is None else h.get_tensor(name)


class OfflineFeatures:
    """A disk cache of target features, one safetensors shard per ``shard_size`` samples of each split, keyed by
    sample ``index``: ``aux.{i}`` (s, 3*H) and ``last.{i}`` (s, H), the final (normed) hidden state from which
    ``load`` recomputes the target's logits with its output embedding. bf16 on disk."""

    def __init__(self, recipe: dict, target, aux_layer_ids, accelerator, shard_size: int = 64, batch_size: int | None = None):
        self.dir = Path(recipe["features"]["cache_dir"] or Path(recipe["work_dir"]) / "features")
        self.target, self.aux_ids, self.acc, self.shard_size = target, list(aux_layer_ids), accelerator, shard_size
        self.batch_size = batch_size or recipe["train"]["batch_size"]
        self.reuse_from = [Path(p) for p in recipe["features"].get("reuse_from") or []]
        self._reader = ShardReader(self.dir)

    def estimate_bytes(self, datasets) -> int:
        H = self.target.config.get_text_config().hidden_size
        tokens = sum(sum(len(x) for x in ds["input_ids"]) for ds in datasets)
        return tokens * (len(self.aux_ids) + 1) * H * 2  # bf16

    def _meta(self, datasets) -> dict:
        cfg = self.target.config.get_text_config()
        return {
            "aux_layer_ids": self.aux_ids,
            "shard_size": self.shard_size,
            "hidden_size": cfg.hidden_size,
            "target": getattr(self.target.config, "_name_or_path", None),
            "data": [getattr(ds, "_fingerprint", None) for ds in datasets],
        }

    def _check_meta(self, meta: dict) -> None:
        """A cache written for other data, layers or another target must not be read as this one's."""
        path = self.dir / "index.json"
        if path.exists():
            old = json.loads(path.read_text())
            diff = [k for k in meta if k in old and old[k] != meta[k]]
            if diff:
                raise ValueError(
                    f"The feature cache {self.dir} was built with other {', '.join(diff)}: delete it or set "
                    "features.cache_dir to a new folder."
                )

    def _reusable(self, meta: dict) -> dict[str, tuple[ShardReader, int]]:
        """sample_key -> (reader, sample index) over the earlier runs of ``reuse_from``: work_dirs whose
        ``features/`` were built for the same target and layers, read with their ``data/tokenized`` samples. A run
        that is not on this machine is skipped (its samples are computed); one that cannot serve is an error."""
        found: dict = {}
        for run in self.reuse_from:
            if not run.exists():
                print(f"[features] reuse_from: {run} not found: its samples' features are computed")
                continue
            index, data = run / "features" / "index.json", run / "data" / "tokenized"
            if not index.exists() or not (data / "dataset_dict.json").exists():
                raise FileNotFoundError(
                    f"features.reuse_from: {run} is not the work_dir of an offline-features run "
                    f"(it needs features/index.json and data/tokenized): fix or remove the entry."
                )
            old = json.loads(index.read_text())
            diff = [k for k in ("aux_layer_ids", "hidden_size", "target") if old.get(k) != meta[k]]
            if diff:
                raise ValueError(
                    f"features.reuse_from: {run} was built with other {', '.join(diff)} "
                    f"({', '.join(f'{old.get(k)!r}' for k in diff)}): its features are not this target's; "
                    "remove the entry."
                )
            reader = ShardReader(run / "features")
            for split in load_from_disk(str(data)).values():
                for i, ids in zip(split["index"], split["input_ids"]):
                    found.setdefault(sample_key(ids), (reader, i))
        return found

    @torch.no_grad()
    def build(self, datasets, pad_id: int) -> None:
        """Write the missing shards (a killed build resumes at the first missing shard)."""
        if not self.acc.is_main_process:
            self.acc.wait_for_everyone()
            return
        meta = self._meta(datasets)
        self._check_meta(meta)
        need = self.estimate_bytes(datasets)
        have = sum(f.stat().st_size for f in self.dir.glob("*.safetensors")) if self.dir.exists() else 0
        probe = self.dir if self.dir.exists() else next(p for p in self.dir.parents if p.exists())
        free = shutil.disk_usage(probe).free
        print(
            f"[features] offline cache: ~{need / 2**30:.2f} GiB in {self.dir} ({have / 2**30:.2f} GiB done, "
            f"{free / 2**30:.1f} GiB free)"
        )
        if need - have > free * 0.95:
            raise OSError(
                f"The feature cache needs ~{(need - have) / 2**30:.1f} GiB more but {self.dir} has "
                f"{free / 2**30:.1f} GiB free: free space, set features.cache_dir elsewhere, or use features.mode: online."
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.dir / "index.json", meta)  # a kill mid-write must not leave an index that parses wrong
        device = self.target.device
        reusable = self._reusable(meta) if self.reuse_from else {}
        reused = 0
        for split, ds in enumerate(datasets):
            n_shards = (len(ds) + self.shard_size - 1) // self.shard_size
            for s in tqdm(range(n_shards), desc=f"features split {split}", unit="shard"):
                path = self.dir / f"split{split}-{s:05d}.safetensors"
                if path.exists():
                    continue
                tensors = {}
                rows = ds.select(range(s * self.shard_size, min(len(ds), (s + 1) * self.shard_size)))
                row_lengths = [len(x) for x in rows["input_ids"]]
                todo = []  # rows to run the target on
                for r, (index, ids) in enumerate(zip(rows["index"], rows["input_ids"])):
                    hit = reusable.get(sample_key(ids)) if reusable else None
                    if hit is not None:
                        reader, old = hit
                        aux, last = reader.get(f"aux.{old}"), reader.get(f"last.{old}")
                        if aux is not None and last is not None and aux.shape[0] == len(ids):
                            tensors[f"aux.{index}"], tensors[f"last.{index}"] = aux, last
                            reused += 1
                            continue
                    todo.append(r)
                order = sorted(todo, key=lambda r: row_lengths[r])  # batches of similar lengths: less padding
                for b in range(0, len(order), self.batch_size):
                    batch = rows.select(order[b : b + self.batch_size])
                    lengths = [len(x) for x in batch["input_ids"]]
                    ids = torch.full((len(lengths), max(lengths)), pad_id, dtype=torch.long)
                    att = torch.zeros_like(ids)
                    for r, x in enumerate(batch["input_ids"]):
                        ids[r, : len(x)] = torch.tensor(x)
                        att[r, : len(x)] = 1
                    out = self.target(
                        input_ids=ids.to(device),
                        attention_mask=att.to(device),
                        output_hidden_states=True,
                        use_cache=False,
                        logits_to_keep=no_logits(device),
                    )
                    aux = torch.cat([out.hidden_states[i + 1] for i in self.aux_ids], -1).to(torch.bfloat16).cpu()
                    last = out.hidden_states[-1].to(torch.bfloat16).cpu()  # after the final norm: logits = lm_head(last)
                    for r, (index, n) in enumerate(zip(batch["index"], lengths)):
                        tensors[f"aux.{index}"] = aux[r, :n].contiguous()
                        tensors[f"last.{index}"] = last[r, :n].contiguous()
                with atomic_path(path) as tmp:
                    save_file(tensors, str(tmp))
                free = shutil.disk_usage(self.dir).free
                if free < 2**30:
                    raise OSError(
                        f"Less than 1 GiB left on the disk of {self.dir}: stopping the feature cache "
                        "(it resumes where it stopped once there is space)."
                    )
        if self.reuse_from:
            print(f"[features] {reused} samples' features taken from {', '.join(map(str, self.reuse_from))}")
        self.acc.wait_for_everyone()

    def _get(self, index: int, kind: str) -> torch.Tensor:
        t = self._reader.get(f"{kind}.{index}")
        if t is None:
            raise KeyError(f"sample {index} is not in the feature cache {self.dir}: delete the folder and rebuild")
        return t

    @torch.no_grad()
    def load(
        self, batch, logits_at: torch.Tensor | None = None, draft_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | TargetScores]:
        """(b, s, 3*H) aux features and (b, s, V) target logits (at ``logits_at`` only, when given; their
        ``TargetScores`` with ``draft_ids``) for a right-padded batch."""
        b, s = batch["input_ids"].shape
        device = batch["input_ids"].device
        aux_rows, last_rows = [], []
        for i in batch["index"].tolist():
            aux_rows.append(self._get(i, "aux"))
            last_rows.append(self._get(i, "last"))
        H3, H = aux_rows[0].shape[-1], last_rows[0].shape[-1]
        aux = torch.zeros(b, s, H3, dtype=torch.bfloat16)
        last = torch.zeros(b, s, H, dtype=torch.bfloat16)
        for r, (a, l) in enumerate(zip(aux_rows, last_rows)):
            aux[r, : a.shape[0]] = a
            last[r, : l.shape[0]] = l
        logits = target_logits(self.target, last.to(device), None if logits_at is None else logits_at.to(device), draft_ids)
        return aux.to(device), logits


class TrainingFeatures:
    """The target's side of a training batch, ``features(batch, draft)`` -> (aux features, target logits): read from
    the offline cache (``features.mode: offline``, built here once), or a target forward per batch (online)."""

    def __init__(self, recipe: dict, target, aux_layer_ids, datasets, pad_id: int, accelerator):
        self.target, self.aux_layer_ids = target, aux_layer_ids
        self.offline = None
        if recipe["features"]["mode"] == "offline":
            self.offline = OfflineFeatures(recipe, target, aux_layer_ids, accelerator)
            self.offline.build(datasets, pad_id)

    def __call__(self, batch, draft):
        if "document_ids" in batch and self.offline is not None:  # packed: the cache's samples laid out in their rows
            aux, scores = self(unpack_batch(batch), draft)
            return pack_like(aux, batch), TargetScores(*(pack_like(x, batch) for x in (scores.draft, scores.argmax, scores.lse)))
        # the loss reads the target's logits over the draft vocabulary, and of the rest only argmax and log-sum-exp
        at = target_logit_positions(batch["loss_mask"].bool() & batch["attention_mask"].bool())
        ids = draft_token_ids(draft)
        if self.offline is not None:
            return self.offline.load(batch, logits_at=at, draft_ids=ids)
        packed = "document_ids" in batch
        return aux_features(
            self.target,
            batch["input_ids"],
            None if packed else batch["attention_mask"],
            self.aux_layer_ids,
            logits_at=at,
            draft_ids=ids,
            position_ids=batch.get("position_ids"),
        )
