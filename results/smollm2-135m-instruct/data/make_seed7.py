"""Stage-8 data for the reference draft: 960 more prompts written by SmolLM2-135M-Instruct itself (seed 7, a sixth set
of openers aimed at the MT-bench kinds of request where the stage-7 draft accepts least: math 2.81, STEM 2.80,
writing 3.04, reasoning 3.08 on all 80 first turns in bf16), answered greedily by the same target.

    python results/smollm2-135m-instruct/data/make_seed7.py [--dtype bfloat16]

Resumable: the prompts and the answers are appended to their .jsonl files batch by batch, a rerun skips what is
there. Session 12 ran it in bfloat16 on a CPU with bf16 units (batched generation is several times faster there than
in float32); a bf16 greedy answer can part from a float32 one at a near-tie, which changes nothing for training data
(the draft learns the target's distribution; its features are computed by the training recipe). A later stage's
recipe reads the answers with `regenerate: false`, as stages 3-7 read theirs.
"""

import argparse
from pathlib import Path

import torch

from eagle3_hub.targets import load_target
from eagle3_hub.training.data import regenerate, synthesize_prompts

HERE = Path(__file__).parent
# generic starts of a request, never a benchmark question (stages 3-7 used other sets)
OPENERS = ["", "Calculate", "How many", "Solve for", "What is the probability that", "A store sells",
           "Explain step by step how", "Why does", "What causes", "How does the human body", "Describe the process of",
           "What is the role of", "Write a speech about", "Write a cover letter for", "Write a haiku about",
           "Write a travel itinerary for", "Summarize the main ideas of", "Give three arguments for",
           "What are the pros and cons of", "If all", "Is it true that", "Which is larger", "Pretend you are",
           "Act as a", "Write a Python function that", "Debug this code", "What is the time complexity of",
           "Extract the", "Classify the following", "Translate into French", "Plan a", "What would you do if"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-prompts", type=int, default=960)
    ap.add_argument("--batch-size", type=int, default=96)
    args = ap.parse_args()
    torch.set_num_threads(2)
    target, tok = load_target(None, dtype=getattr(torch, args.dtype))
    with torch.inference_mode():
        prompts = synthesize_prompts(target, tok, args.num_prompts, HERE / "synthesized_prompts_steered_seed7.jsonl",
                                     seed=7, openers=OPENERS, batch_size=args.batch_size)
        regenerate(prompts, target, tok, HERE / "regenerated_steered_seed7.jsonl", max_new_tokens=256,
                   batch_size=args.batch_size)


if __name__ == "__main__":
    main()
