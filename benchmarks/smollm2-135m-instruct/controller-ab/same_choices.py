"""Whether the controller with its estimates in torch tensors (another checkout, e.g. this version with
`torch-estimates.patch` applied) chooses what this version's NumPy controller chooses, fed the same observations:
2 rows, synthetic costs, 20 random sequences of 300 steps (accepted tokens, lookup proposals and hits, step times).
Prints, per sequence, whether every step's shape was the same, or the first step where they part. Run from the
repository root:

    PYTHONPATH=. python benchmarks/smollm2-135m-instruct/controller-ab/same_choices.py ../torch
"""

import importlib.util
import random
import sys

import eagle3_hub.generation.tree.controller as this
from eagle3_hub.generation.tree.config import TreeConfig

sys.path.insert(0, "tests")
from test_tree_controller import synthetic

spec = importlib.util.spec_from_file_location("eagle3_hub.generation.tree.other_controller",
                                              f"{sys.argv[1]}/eagle3_hub/generation/tree/controller.py")
other = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = other  # its relative imports resolve in this package; dataclasses look it up
spec.loader.exec_module(other)

costs = synthetic(lambda r, s: 0.01 * (1 + 0.05 * s * r), draft_read=1e-3, draft_level=1e-3)
config = TreeConfig(depth=3, tree_top_k=4, total_tokens=8, lookup_tokens=20, min_node_prob=0.0, grow_min_prob=0.0,
                    draft_graph=False, adaptive=True)
rows = [0, 1]
for seed in range(20):
    rng = random.Random(seed)
    a, b = this.TreeController(config, costs, 2), other.TreeController(config, costs, 2)
    behind, parted = False, None
    for i in range(300):
        lookup = rng.choice([0, 0, 6, 20])
        proposed = [rng.random() < 0.7, rng.random() < 0.7] if lookup else None
        kw = dict(lookup=lookup, proposed=proposed, behind=behind, context=50 + i, remaining=[256 - i, 250 - i])
        sa, sb = a.choose(rows, **kw), b.choose(rows, **kw)
        if (sa.depth, sa.top_k, sa.total_tokens, sa.lookup, sa.row_depth) != (sb.depth, sb.top_k, sb.total_tokens,
                                                                               sb.lookup, sb.row_depth):
            parted = (i, sa.label, sb.label)
            break
        accepted = [rng.randint(0, sa.depth) if sa.depth else 0 for _ in rows]
        looked_up = [rng.random() < 0.3 for _ in rows]
        seconds = rng.uniform(0.01, 0.03)
        for c in (a, b):
            c.observe(rows, sa, accepted, seconds, looked_up, proposed, behind, 50 + i)
        behind = sa.depth == 0
    print(f"sequence {seed}: " + ("the same shape at every step, " + str(dict(a.chosen)) if parted is None
                                   else f"parted at step {parted[0]}: {parted[1]} against {parted[2]}"))
