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
def aux_features(target, input_ids, attention_mask, aux_layer_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, s, 3*H) aux features (outputs of the aux decoder layers) and (b, s, V) target logits."""
    out = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    aux = torch.cat([out.hidden_states[i + 1] for i in aux_layer_ids], dim=-1)
    return aux, out.logits


class OfflineFeatures:
    """A disk cache of target features, one shard per ``shard_size`` samples (keyed by sample ``index``)."""

    def __init__(self, recipe: dict, target, aux_layer_ids, accelerator, shard_size: int = 64):
        self.dir = Path(recipe["features"]["cache_dir"] or Path(recipe["work_dir"]) / "features")
        self.target, self.aux_ids, self.acc, self.shard_size = target, list(aux_layer_ids), accelerator, shard_size
        self._handles: dict = {}

    def _shard(self, split: int, index: int) -> Path:
        return self.dir / f"split{split}-{index // self.shard_size:05d}.safetensors"

    def estimate_bytes(self, datasets) -> int:
        H = self.target.config.get_text_config().hidden_size
        tokens = sum(sum(len(x) for x in ds["input_ids"]) for ds in datasets)
        return tokens * (len(self.aux_ids) + 1) * H * 2  # bf16

    @torch.no_grad()
    def build(self, datasets, pad_id: int) -> None:
        self.datasets = datasets
        if not self.acc.is_main_process:
            self.acc.wait_for_everyone()
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        need = self.estimate_bytes(datasets)
        have = sum(f.stat().st_size for f in self.dir.glob("*.safetensors"))
        free = shutil.disk_usage(self.dir).free
        print(f"[features] offline cache: ~{need / 2**30:.2f} GiB in {self.dir} ({have / 2**30:.2f} GiB done, {free / 2**30:.1f} GiB free)")
        if need - have > free * 0.95:
            raise OSError(f"The feature cache needs ~{(need - have) / 2**30:.1f} GiB more but {self.dir} has "
                          f"{free / 2**30:.1f} GiB free: free space, set features.cache_dir elsewhere, or use features.mode: online.")
        for split, ds in enumerate(datasets):
            n_shards = (len(ds) + self.shard_size - 1) // self.shard_size
            for s in tqdm(range(n_shards), desc=f"features split {split}", unit="shard"):
                path = self.dir / f"split{split}-{s:05d}.safetensors"
                if path.exists():
                    continue
                tensors = {}
                rows = ds.select(range(s * self.shard_size, min(len(ds), (s + 1) * self.shard_size)))
                for ex in rows:
                    ids = torch.tensor([ex["input_ids"]], device=self.target.device)
                    out = self.target.model(input_ids=ids, output_hidden_states=True, use_cache=False)
                    tensors[f"aux.{ex['index']}"] = torch.cat([out.hidden_states[i + 1] for i in self.aux_ids], -1)[0].to(torch.bfloat16).cpu()
                    tensors[f"last.{ex['index']}"] = out.last_hidden_state[0].to(torch.bfloat16).cpu()
                tmp = path.with_suffix(".tmp")
                save_file(tensors, str(tmp))
                os.replace(tmp, path)
                free = shutil.disk_usage(self.dir).free
                if free < 2**30:
                    raise OSError(f"Less than 1 GiB left on the disk of {self.dir}: stopping the feature cache (resumable).")
        (self.dir / "index.json").write_text(json.dumps({"shard_size": self.shard_size, "aux_layer_ids": self.aux_ids}))
        self.acc.wait_for_everyone()

    def _get(self, index: int, kind: str) -> torch.Tensor:
        if not self._handles:  # sample index -> open shard, built once
            self._where = {}
            for p in sorted(self.dir.glob("split*.safetensors")):
                h = self._handles[p] = safe_open(str(p), "pt")
                for key in h.keys():
                    self._where[key] = h
        h = self._where.get(f"{kind}.{index}")
        if h is None:
            raise KeyError(f"sample {index} is not in the feature cache {self.dir}: delete the folder and rebuild")
        return h.get_tensor(f"{kind}.{index}")

    @torch.no_grad()
    def load(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, s, 3*H) aux features and (b, s, V) target logits for a right-padded batch."""
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
        lm_head = self.target.get_output_embeddings()
        last = last.to(device=device, dtype=lm_head.weight.dtype)
        return aux.to(device), lm_head(last)
