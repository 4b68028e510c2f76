"""Writes tests/fixtures/peer_exports/specforge-0.2.0-sglang with SpecForge 0.2.0's own code: its draft class
(``AutoDraftModel.from_config`` on a SpecForge draft config, its Llama-3 config scaled down), a training state of
random weights in the shape its trainer saves, and its exporter ``export_to_sglang`` (``specforge export --to
sglang``). Then one step of its draft on fixed features, stored beside the export folder (``<folder>.step.safetensors``:
features, tokens, the embedding used, logits) for tests/test_formats_published.py to compare ours with.

Not run by CI: SpecForge 0.2.0 pins torch 2.11 and transformers 5.8.1 (and sglang 0.5.14). It was run once in a
throwaway environment: python3 -m venv V; V/bin/pip install torch==2.13.0 transformers==5.8.1 safetensors
huggingface-hub pyyaml pydantic psutil numpy tqdm accelerate; V/bin/pip install --no-deps specforge==0.2.0;
V/bin/python tests/peers/specforge_export.py tests/fixtures/peer_exports/specforge-0.2.0-sglang (the CPU torch 2.13
build stood in for 2.11: the classes and the exporter used here call nothing that changed between the two).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

DRAFT_CONFIG = {  # SpecForge's configs/llama3-8B-eagle3.json keys, the sizes scaled to the tests' tiny Llama
    "architectures": ["LlamaForCausalLMEagle3"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 256,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 256,
    "draft_vocab_size": 100,
}


def main(out: str) -> None:
    from specforge.export.to_sglang import export_to_sglang
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig

    work = Path(tempfile.mkdtemp())
    (work / "draft.json").write_text(json.dumps(DRAFT_CONFIG, indent=2))
    model = AutoDraftModel.from_config(AutoDraftModelConfig.from_file(str(work / "draft.json")), torch_dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.05 if p.dim() > 1 else 0.1) + (p.dim() == 1))
        ids = torch.randperm(256, generator=g)[:100].sort().values
        model.d2t.copy_(ids - torch.arange(100))
        model.t2d.zero_()
        model.t2d[ids] = True
        model.embed_tokens.weight.copy_(torch.randn(model.embed_tokens.weight.shape, generator=g) * 0.5)
    # the trainer's checkpoint: strategy and the draft's state without its embedding (it is the target's)
    state = {"strategy": "eagle3", "draft_state_dict": {k: v for k, v in model.state_dict().items() if "embed" not in k}}
    torch.save(state, work / "training_state.pt")
    export_to_sglang(str(work / "training_state.pt"), str(work / "draft.json"), out)

    # one step of SpecForge's draft (its forward: fc, the decoder layer, the final norm; then lm_head) on features
    # rounded to bfloat16, the exported weights' dtype
    exported = AutoDraftModel.from_config(AutoDraftModelConfig.from_file(str(work / "draft.json")), torch_dtype=torch.float32)
    exported.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    with torch.no_grad():
        for p in exported.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        feats = (torch.randn(1, 40, 3 * 64, generator=g) * 2.0).to(torch.bfloat16).float()
        input_ids = torch.randint(3, 256, (1, 40), generator=g)
        hidden = exported(hidden_states=feats, inputs_embeds=exported.embed_input_ids(input_ids))
        logits = exported.lm_head(hidden)
    save_file(
        {
            "hidden_states": feats,
            "input_ids": input_ids,
            "embed_tokens": exported.embed_tokens.weight.detach(),
            "logits": logits.contiguous(),
        },
        str(Path(out).parent / (Path(out).name + ".step.safetensors")),
    )


if __name__ == "__main__":
    main(sys.argv[1])
