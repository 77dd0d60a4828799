"""Real SmolLM2 target/draft pairs for the optimal-verifier benchmark and tests, logged by the executor.

``log_pairs`` runs the multi-draft decoder (RRS, early-exit drafter) with full distribution logging on a few
prompts and returns the float64 ``(p, q)`` at every drafted position. ``compress_pair`` keeps the tokens that
carry the mass (the top ``k`` of ``p`` and of ``q``) and one *rest* bucket per side, so that a handful of real
pairs fit in a small test-data file.
"""

from __future__ import annotations

import numpy as np

from executor.logs import step_distributions

PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The capital of France is",
    "Write a short poem about the sea.",
    "import numpy as np\n\ndef normalise(x):\n",
)


def log_pairs(temperature: float, *, drafter: str = "early-exit:15", steps: int = 32, seed: int = 0):
    """``(p, q)`` arrays ``(m, V)`` logged at every drafted position over :data:`PROMPTS`."""

    from executor.device import set_threads
    from executor.generate import generate
    from executor.weights import load_model

    set_threads(1)
    model, tokenizer = load_model()
    ps, qs = [], []
    for index, prompt in enumerate(PROMPTS):
        result = generate(
            prompt,
            model=model,
            tokenizer=tokenizer,
            decoder="multidraft",
            drafter=drafter,
            n=2,
            temperature=temperature,
            max_new_tokens=steps,
            seed=seed + index,
            log_distributions="full",
            stop_at_eos=False,
        )
        for step in result.steps:
            if step.distributions is not None:
                p, q = step_distributions(step)
                ps.append(p)
                qs.append(q)
    return np.concatenate(ps), np.concatenate(qs)


def compress_pair(p: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` tokens of ``p`` and of ``q`` (their union, in id order) plus one rest bucket per side.

    The rest buckets are two separate columns (the target's rest, then the draft's), so that the compressed
    pair keeps both remaining masses without inventing overlap between them.
    """
    keep = np.union1d(np.argsort(-p)[:k], np.argsort(-q)[:k])
    rest = np.ones(p.shape[-1], dtype=bool)
    rest[keep] = False
    p_small = np.r_[p[keep], p[rest].sum(), 0.0]
    q_small = np.r_[q[keep], 0.0, q[rest].sum()]
    return p_small / p_small.sum(), q_small / q_small.sum()
