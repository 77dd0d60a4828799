"""Quick greedy chain speed ratio of trained drafters against plain decoding, interleaved, float32, 1 thread.

Usage: python scripts/chain_speed_ratio.py exit:18 kangaroo:2   (each spec as for --drafter; gamma 3, Kangaroo
with the confidence stop at 0.3). Prints total time, the ratio plain / drafter and tau; asserts greedy equality.
"""

import statistics
import sys
import time

import torch

from executor.decoders import AutoregressiveDecoder, ChainDecoder, ConfidenceStop
from executor.drafters import parse_drafter
from executor.weights import load_model

torch.set_num_threads(1)
m, tok = load_model(device="cpu", dtype=torch.float32)
prompts = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "import os\n\n\ndef list_python_files(root):\n",
]
ids = [tok.encode(p) for p in prompts]
decs = {"plain": AutoregressiveDecoder(m)}
for spec in sys.argv[1:]:
    decs[spec] = ChainDecoder(
        m,
        parse_drafter(spec, m),
        gamma=3,
        stop_rule=ConfidenceStop(0.3) if spec.startswith("kangaroo") else None,
    )
times = {k: [] for k in decs}
tau = {k: [] for k in decs}
for _ in range(2):
    for p in ids:
        ref = None
        for k, d in decs.items():
            t = time.perf_counter()
            r = d.generate(p, 40)
            times[k].append(time.perf_counter() - t)
            tau[k].append(len(r.token_ids) / len(r.steps))
            ref = ref or r.token_ids
            assert r.token_ids == ref, k
for k in decs:
    print(
        k,
        "time",
        round(sum(times[k]), 1),
        "ratio vs plain",
        round(sum(times["plain"]) / sum(times[k]), 3),
        "tau",
        round(statistics.mean(tau[k]), 3),
        flush=True,
    )
