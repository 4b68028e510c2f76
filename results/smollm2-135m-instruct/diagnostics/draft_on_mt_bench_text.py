import os, torch, json, sys
from eagle3_hub.targets import load_target
from eagle3_hub.modeling_eagle3 import Eagle3DraftModel
from eagle3_hub import generate
from eagle3_hub.training.features import aux_features
from eagle3_hub.training.ttt import ttt_loss, acceptance_metrics
torch.set_num_threads(1)
target, tok = load_target(None, dtype=torch.float32)
path = sys.argv[1] if len(sys.argv) > 1 else "eagle3_hub/reference_draft/smollm2-135m-instruct"
draft = Eagle3DraftModel.from_pretrained(path, target=target).float()
qs = [json.loads(l) for l in open(os.environ.get("MT_BENCH", "../shared/benchmarks/mt_bench.jsonl"))][:2]
for q in qs:
    text = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True, tokenize=False)
    ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
    out = generate(target, draft, ids, max_new_tokens=128, do_sample=False, depth=5, top_k=1, total_tokens=5)
    hist = out.stats.accept_hist if hasattr(out.stats, "accept_hist") else None
    print("chain inference: acceptance", round(out.stats.mean_acceptance_length, 3), "hist", hist)
    seq = out.sequences
    lm = torch.zeros_like(seq); lm[:, ids.shape[1]:] = 1
    att = torch.ones_like(seq)
    aux, logits = aux_features(target, seq, att, draft.config.aux_layer_ids)
    d = draft.unbind(keep_target=False) if False else draft
    with torch.no_grad():
        o = ttt_loss(draft, aux, seq, logits, lm, att, ttt_steps=5)
    m = acceptance_metrics(o.step_correct, o.step_count, o.chain_correct, o.chain_count)
    print("ttt on same text: step acc", [round(a, 2) for a in m["step_accuracy"]], "chain", [round(a, 2) for a in m["chain_acceptance"]], "expected", round(m["expected_acceptance_length"], 3))
