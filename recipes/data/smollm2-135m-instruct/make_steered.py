"""Data for later stages of the reference draft: prompts written by SmolLM2-135M-Instruct itself, each started by one
of a set of openers, answered greedily by the same target.

    python results/smollm2-135m-instruct/data/make_steered.py --seed 7 [--dtype bfloat16]   # stage 8 (session 12)
    python results/smollm2-135m-instruct/data/make_steered.py --seed 8                      # stage 9 (session 13)
    python results/smollm2-135m-instruct/data/make_steered.py --seed 9                      # stage 10 (session 14)
    python results/smollm2-135m-instruct/data/make_steered.py --seed 10                     # stage 11 (session 16)

Writes ``synthesized_prompts_steered_seed{N}.jsonl`` and ``regenerated_steered_seed{N}.jsonl`` next to this file.
Resumable: the prompts and the answers are appended batch by batch, a rerun skips what is there. Sessions 12-13 ran
it in bfloat16 on a CPU with bf16 units (batched generation is several times faster there than in float32); a bf16
greedy answer can part from a float32 one at a near-tie, which changes nothing for training data (the draft learns
the target's distribution; its features are computed by the training recipe). A later stage's recipe reads the
answers with `regenerate: false`, as stages 3-8 read theirs. (Seeds 2-6 were made by the stage recipes themselves,
`data.synthesize` with their `synthesize_openers`.)
"""

import argparse
from pathlib import Path

import torch

from eagle3_hub.targets import load_target
from eagle3_hub.training.data import regenerate, synthesize_prompts

HERE = Path(__file__).parent
# Generic starts of a request, never a benchmark question; each seed has its own set (stages 3-7 used others, in
# their recipes). Both aim at the MT-bench kinds of request where the draft accepts least in bf16 (stage 7, all 80
# first turns: math 2.81, STEM 2.80, writing 3.04, reasoning 3.08).
OPENERS = {
    7: ["", "Calculate", "How many", "Solve for", "What is the probability that", "A store sells",
        "Explain step by step how", "Why does", "What causes", "How does the human body", "Describe the process of",
        "What is the role of", "Write a speech about", "Write a cover letter for", "Write a haiku about",
        "Write a travel itinerary for", "Summarize the main ideas of", "Give three arguments for",
        "What are the pros and cons of", "If all", "Is it true that", "Which is larger", "Pretend you are",
        "Act as a", "Write a Python function that", "Debug this code", "What is the time complexity of",
        "Extract the", "Classify the following", "Translate into French", "Plan a", "What would you do if"],
    8: ["", "Compute the", "What is the area of", "A company has", "John has", "Derive", "What is the value of",
        "Describe the physics of", "How do vaccines", "Explain the theory of", "What is the chemical", "How do plants",
        "Write a limerick about", "Write a review of", "Write the opening paragraph of", "Write a script for",
        "Write a motivational", "Respond as", "As a", "Three friends", "What can we conclude if",
        "Evaluate the argument that", "Write a recursive function", "Optimize this", "Write a regular expression",
        "Identify the named entities in", "Return a JSON object", "What were the causes of", "Discuss the impact of",
        "How did", "Give me advice on", "Rank the following"],
    # seed 9 (session 14): coding, STEM and writing, where stage 8 accepts least on all 80 MT-bench first turns in
    # bf16 (coding 2.88, STEM 2.93, writing 2.95, math 3.09)
    9: ["", "Write a JavaScript function", "Implement a class", "Write a program that", "Fix the bug in",
        "Explain what this code does", "Write a function to find", "What is the difference between a", "Explain how",
        "What happens when", "Why is the sky", "How do scientists", "Describe the structure of", "In physics,",
        "Write a short story about", "Write an email to", "Write a blog post about", "Draft a", "Rewrite the following",
        "Compose a", "Edit this paragraph", "A rectangle has", "Find the", "If x", "What is the sum of",
        "Suppose that", "Imagine you are", "Give an example of", "List five", "Compare and contrast",
        "What are the main", "Summarize"],
    # seed 10 (session 16): STEM, reasoning, humanities and writing, where stage 10 accepts least on 40 MT-bench first
    # turns in float32 (STEM 2.98, reasoning 3.04, humanities 3.11, writing 3.11; stage10_vs_stage9_float32/)
    10: ["", "Explain the concept of", "How does a", "What is the function of", "Describe how energy",
         "What is the difference between", "In chemistry,", "In biology,", "How would an engineer", "Why do",
         "If it takes", "A train leaves", "Who is taller if", "What comes next in the sequence", "Is the following",
         "Think step by step:", "What is the significance of", "How did the", "Analyze the themes of",
         "What lessons can we learn from", "Explain the philosophy of", "Describe the history of",
         "Write a persuasive essay", "Write a poem about", "Write a letter to", "Write a product description for",
         "Write a dialogue between", "Create a", "Help me write", "Brainstorm", "What advice would you give",
         "Describe a day in the life of"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True, choices=sorted(OPENERS))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-prompts", type=int, default=960)
    ap.add_argument("--batch-size", type=int, default=96)
    args = ap.parse_args()
    torch.set_num_threads(2)
    target, tok = load_target(None, dtype=getattr(torch, args.dtype))
    with torch.inference_mode():
        prompts = synthesize_prompts(target, tok, args.num_prompts,
                                     HERE / f"synthesized_prompts_steered_seed{args.seed}.jsonl", seed=args.seed,
                                     openers=OPENERS[args.seed], batch_size=args.batch_size)
        regenerate(prompts, target, tok, HERE / f"regenerated_steered_seed{args.seed}.jsonl", max_new_tokens=256,
                   batch_size=args.batch_size)


if __name__ == "__main__":
    main()
