"""Target features for training: the three aux-layer outputs and the target's logits.

online: a target forward inside each training step.
offline: one pass writes safetensors shards (bf16) of the aux features and the target's final hidden state;
training reads them and applies the target's ``lm_head``. Resumable shard by shard, size estimated first,
and a clear stop when the disk would fill.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm


@torch.no_grad()
def aux_features(target, input_ids, attention_mask, aux_layer_ids, logits_at: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, s, 3*H) aux features (outputs of the aux decoder layers) and (b, s, V) target logits.

    logits_at: (b, s) bool, the positions whose logits are wanted (``ttt.target_logit_positions``); the others
    are left at 0. The target's output layer over its full vocabulary is then run on those rows only."""
    if logits_at is None:
        out = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
        logits = out.logits
    else:
        out = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False,
                     logits_to_keep=1)
        logits = target_logits(target, out.hidden_states[-1], logits_at)
    aux = torch.cat([out.hidden_states[i + 1] for i in aux_layer_ids], dim=-1)
    return aux, logits


@torch.no_grad()
def target_logits(target, last: torch.Tensor, logits_at: torch.Tensor | None = None) -> torch.Tensor:
    """(b, s, V) logits from the target's final (normed) hidden state ``last`` (b, s, H), at ``logits_at`` only
    (zeros elsewhere) when it is given."""
    lm_head = target.get_output_embeddings()
    last = last.to(lm_head.weight.dtype)
    if logits_at is None:
        logits = lm_head(last)
    else:
        logits = last.new_zeros(last.shape[:2] + (lm_head.weight.shape[0],))
        logits[logits_at] = lm_head(last[logits_at])
    softcap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)
    if softcap:  # Gemma 2 / 3
        logits = torch.tanh(logits / softcap) * softcap
    return logits


class OfflineFeatures:
    """A disk cache of target features, one safetensors shard per ``shard_size`` samples of each split, keyed by
    sample ``index``: ``aux.{i}`` (s, 3*H) and ``last.{i}`` (s, H), the final (normed) hidden state from which
    ``load`` recomputes the target's logits with its output embedding. bf16 on disk."""

    def __init__(self, recipe: dict, target, aux_layer_ids, accelerator, shard_size: int = 64, batch_size: int | None = None):
        self.dir = Path(recipe["features"]["cache_dir"] or Path(recipe["work_dir"]) / "features")
        self.target, self.aux_ids, self.acc, self.shard_size = target, list(aux_layer_ids), accelerator, shard_size
        self.batch_size = batch_size or recipe["train"]["batch_size"]
        self._handles: dict = {}
        self._where: dict = {}

    def estimate_bytes(self, datasets) -> int:
        H = self.target.config.get_text_config().hidden_size
        tokens = sum(sum(len(x) for x in ds["input_ids"]) for ds in datasets)
        return tokens * (len(self.aux_ids) + 1) * H * 2  # bf16

    def _meta(self, datasets) -> dict:
        cfg = self.target.config.get_text_config()
        return {"aux_layer_ids": self.aux_ids, "shard_size": self.shard_size, "hidden_size": cfg.hidden_size,
                "target": getattr(self.target.config, "_name_or_path", None),
                "data": [getattr(ds, "_fingerprint", None) for ds in datasets]}

    def _check_meta(self, meta: dict) -> None:
        """A cache written for other data, layers or another target must not be read as this one's."""
        path = self.dir / "index.json"
        if path.exists():
            old = json.loads(path.read_text())
            diff = [k for k in meta if k in old and old[k] != meta[k]]
            if diff:
                raise ValueError(f"The feature cache {self.dir} was built with other {', '.join(diff)}: delete it or set "
                                 "features.cache_dir to a new folder.")

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
        print(f"[features] offline cache: ~{need / 2**30:.2f} GiB in {self.dir} ({have / 2**30:.2f} GiB done, "
              f"{free / 2**30:.1f} GiB free)")
        if need - have > free * 0.95:
            raise OSError(f"The feature cache needs ~{(need - have) / 2**30:.1f} GiB more but {self.dir} has "
                          f"{free / 2**30:.1f} GiB free: free space, set features.cache_dir elsewhere, or use features.mode: online.")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "index.json").write_text(json.dumps(meta))
        device = self.target.device
        for split, ds in enumerate(datasets):
            n_shards = (len(ds) + self.shard_size - 1) // self.shard_size
            for s in tqdm(range(n_shards), desc=f"features split {split}", unit="shard"):
                path = self.dir / f"split{split}-{s:05d}.safetensors"
                if path.exists():
                    continue
                tensors = {}
                rows = ds.select(range(s * self.shard_size, min(len(ds), (s + 1) * self.shard_size)))
                row_lengths = [len(x) for x in rows["input_ids"]]
                order = sorted(range(len(rows)), key=lambda r: row_lengths[r])  # batches of similar lengths: less padding
                for b in range(0, len(rows), self.batch_size):
                    batch = rows.select(order[b:b + self.batch_size])
                    lengths = [len(x) for x in batch["input_ids"]]
                    ids = torch.full((len(lengths), max(lengths)), pad_id, dtype=torch.long)
                    att = torch.zeros_like(ids)
                    for r, x in enumerate(batch["input_ids"]):
                        ids[r, : len(x)] = torch.tensor(x)
                        att[r, : len(x)] = 1
                    out = self.target(input_ids=ids.to(device), attention_mask=att.to(device), output_hidden_states=True,
                                      use_cache=False, logits_to_keep=1)
                    aux = torch.cat([out.hidden_states[i + 1] for i in self.aux_ids], -1).to(torch.bfloat16).cpu()
                    last = out.hidden_states[-1].to(torch.bfloat16).cpu()  # after the final norm: logits = lm_head(last)
                    for r, (index, n) in enumerate(zip(batch["index"], lengths)):
                        tensors[f"aux.{index}"] = aux[r, :n].contiguous()
                        tensors[f"last.{index}"] = last[r, :n].contiguous()
                tmp = path.with_suffix(".tmp")
                save_file(tensors, str(tmp))
                os.replace(tmp, path)
                free = shutil.disk_usage(self.dir).free
                if free < 2**30:
                    raise OSError(f"Less than 1 GiB left on the disk of {self.dir}: stopping the feature cache "
                                  "(it resumes where it stopped once there is space).")
        self.acc.wait_for_everyone()

    def _get(self, index: int, kind: str) -> torch.Tensor:
        if not self._handles:  # sample index -> open shard, built once
            for p in sorted(self.dir.glob("split*.safetensors")):
                h = self._handles[p] = safe_open(str(p), "pt")
                for key in h.keys():
                    self._where[key] = h
        h = self._where.get(f"{kind}.{index}")
        if h is None:
            raise KeyError(f"sample {index} is not in the feature cache {self.dir}: delete the folder and rebuild")
        return h.get_tensor(f"{kind}.{index}")

    @torch.no_grad()
    def load(self, batch, logits_at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, s, 3*H) aux features and (b, s, V) target logits (at ``logits_at`` only, when given) for a
        right-padded batch."""
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
        logits = target_logits(self.target, last.to(device), None if logits_at is None else logits_at.to(device))
        return aux.to(device), logits
