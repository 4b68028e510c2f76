"""The self-written prompts of the reference draft's later stages: prompts written by SmolLM2-135M-Instruct itself,
each started by one of a set of openers (a small target left alone mostly asks for advice), answered greedily by the
same target.

    python recipes/data/smollm2-135m-instruct/make_steered.py --seed 10

Writes ``synthesized_prompts_steered_seed{N}.jsonl`` (the prompts) and ``regenerated_steered_seed{N}.jsonl`` (the
answered conversations that recipes/smollm2-135m-instruct.yaml reads) next to this file. Resumable: prompts and
answers are appended batch by batch, a rerun skips what is there. Sampling depends on the batch size and the dtype,
so each seed's defaults are the ones its file was made with (a bf16 greedy answer can part from a float32 one at a
near-tie, which changes nothing for training data: the draft learns the target's distribution). The same data comes
from a recipe alone with ``data.synthesize``, ``data.synthesize_seed`` and ``data.synthesize_openers``.
"""

import argparse
from pathlib import Path

import torch

from eagle3_hub.targets import load_target
from eagle3_hub.training.generation import regenerate, synthesize_prompts

HERE = Path(__file__).parent
# Generic starts of a request, never a benchmark question; each seed has its own set, aimed at the kinds of request
# (MT-bench categories) where the draft of the stage before accepted least.
OPENERS = {
    2: ["", "Write", "Compose", "Write a short story", "Draft an email", "Imagine you are", "Pretend to be", "Act as",
        "Explain", "Describe", "What is the difference between", "Why", "How", "Solve", "Calculate",
        "Write a Python function", "Write a program", "Given the following", "Extract", "Summarize", "Compare",
        "Suggest", "Rewrite", "Edit the following", "List", "Discuss"],
    3: ["", "Write a poem", "Write a persuasive essay", "Write a blog post", "Craft", "Create a", "You are a",
        "Assume the role of", "Suppose", "If", "A train", "Find", "Prove", "Implement", "Write a C++ program",
        "Write a JavaScript function", "Debug", "Identify", "Analyze", "Evaluate", "Provide", "Can you", "Tell me",
        "Outline", "Translate", "Classify", "Consider", "In the field of", "Here is a", "Please"],
    4: ["", "Generate", "Design", "Develop a", "Paraphrase", "Role-play as", "You are an expert", "Imagine",
        "In a world where", "Estimate", "What would happen if", "Answer the following", "Determine", "Show that",
        "Write a SQL query", "Write a Bash script", "Fix the bug", "Parse", "Convert", "Given a list", "Which",
        "Who was", "Is it true that", "Argue", "Critique", "Brainstorm", "Plan", "Recommend", "Teach me",
        "Give an example of"],
    5: ["", "Explain the concept of", "How does", "What is the role of", "Describe the process of",
        "What are the main causes of", "Explain how", "What are the advantages and disadvantages of",
        "Write a Python function that", "Write a function to", "Implement", "Given an array", "Write a class",
        "What is the time complexity of", "A store", "Calculate the", "Solve for", "How many",
        "What is the probability that", "Write a descriptive paragraph about", "Write a letter", "Write a speech",
        "Write an essay on", "Write a product description", "Write a story about", "Explain why",
        "What are the key differences between", "If all", "Think step by step", "Describe the history of",
        "What are some tips for", "Act as a", "Summarize the main ideas of", "Evaluate the"],
    6: ["", "What is the difference between", "How do scientists", "Explain the science behind", "What happens when",
        "Why do", "Describe how", "What are the applications of", "Compose a poem about", "Draft an email",
        "Write a short story in which", "Write a persuasive essay", "Create a dialogue between",
        "Write a blog post about", "Write a program that", "Write a SQL query", "How would you implement",
        "Explain this code", "Write a unit test for", "Find the", "Prove that", "A train", "What is the sum of", "If a",
        "Suppose", "Which of the following", "Imagine you are", "Compare and contrast", "Give me a plan for",
        "Rewrite the following", "List the", "What would happen if"],
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
    # coding, STEM and writing
    9: ["", "Write a JavaScript function", "Implement a class", "Write a program that", "Fix the bug in",
        "Explain what this code does", "Write a function to find", "What is the difference between a", "Explain how",
        "What happens when", "Why is the sky", "How do scientists", "Describe the structure of", "In physics,",
        "Write a short story about", "Write an email to", "Write a blog post about", "Draft a", "Rewrite the following",
        "Compose a", "Edit this paragraph", "A rectangle has", "Find the", "If x", "What is the sum of",
        "Suppose that", "Imagine you are", "Give an example of", "List five", "Compare and contrast",
        "What are the main", "Summarize"],
    # STEM, reasoning, humanities and writing
    10: ["", "Explain the concept of", "How does a", "What is the function of", "Describe how energy",
         "What is the difference between", "In chemistry,", "In biology,", "How would an engineer", "Why do",
         "If it takes", "A train leaves", "Who is taller if", "What comes next in the sequence", "Is the following",
         "Think step by step:", "What is the significance of", "How did the", "Analyze the themes of",
         "What lessons can we learn from", "Explain the philosophy of", "Describe the history of",
         "Write a persuasive essay", "Write a poem about", "Write a letter to", "Write a product description for",
         "Write a dialogue between", "Create a", "Help me write", "Brainstorm", "What advice would you give",
         "Describe a day in the life of"],
}


# (dtype, prompts per batch, prompts) each seed's file was made with
MADE_WITH = {2: ("float32", 16, 640), 3: ("float32", 16, 640), 4: ("float32", 96, 640), 5: ("float32", 96, 960),
             6: ("float32", 96, 960), **{n: ("bfloat16", 96, 960) for n in range(7, 11)}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True, choices=sorted(OPENERS))
    ap.add_argument("--dtype", help="default: the seed's (MADE_WITH)")
    ap.add_argument("--num-prompts", type=int, help="default: the seed's (MADE_WITH)")
    ap.add_argument("--batch-size", type=int, help="default: the seed's (MADE_WITH)")
    args = ap.parse_args()
    dtype, batch, num = MADE_WITH[args.seed]
    args.dtype, args.batch_size, args.num_prompts = args.dtype or dtype, args.batch_size or batch, args.num_prompts or num
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
