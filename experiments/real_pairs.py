"""Real SmolLM2 target/draft pairs for the optimal-verifier benchmark and tests, logged by the executor.

``log_pairs`` runs the multi-draft decoder (RRS, early-exit drafter) with full distribution logging on a few
prompts and returns the float64 ``(p, q)`` at every drafted position. ``compress_pair`` keeps the tokens that
carry the mass (the top ``k`` of ``p`` and of ``q``) and one *rest* bucket per side, so that a handful of real
pairs fit in a small test-data file.

Run ``python -m experiments.real_pairs --temperature 0.7 --steps 32 --out pairs.npz``: logs the pairs, writes
them (``p``, ``q``) atomically, and a JSON summary next to them (``pairs.json``: count, vocabulary, and the mean
:math:`\alpha^*` of i.i.d. drafts for n = 2, 4, 8).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from executor.files import atomic_path
from executor.logs import step_distributions

PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The capital of France is",
    "Write a short poem about the sea.",
    "import numpy as np\n\ndef normalise(x):\n",
)


def log_pairs(
    temperature: float,
    *,
    drafter: str = "early-exit:15",
    steps: int = 32,
    seed: int = 0,
    prompts=PROMPTS,
    model=None,
    tokenizer=None,
):
    """``(p, q)`` arrays ``(m, V)`` logged at every drafted position over ``prompts`` (default
    :data:`PROMPTS`) with ``model`` and ``tokenizer`` (default: the embedded SmolLM2)."""

    from executor.device import set_threads
    from executor.generate import generate

    set_threads(1)
    if model is None:
        from executor.weights import load_model

        model, tokenizer = load_model()
    ps, qs = [], []
    for index, prompt in enumerate(prompts):
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


def summary(p: np.ndarray, q: np.ndarray, temperature: float, drafter: str, steps: int) -> dict:
    """Count, vocabulary and the mean alpha* of i.i.d. drafts (n = 2, 4, 8) of logged pairs."""
    from theory import optimal_acceptance

    return {
        "pairs": int(p.shape[0]),
        "vocab": int(p.shape[-1]),
        "temperature": temperature,
        "drafter": drafter,
        "steps_per_prompt": steps,
        "alpha_star_mean": {
            str(n): float(np.mean([optimal_acceptance(a, b, n) for a, b in zip(p, q, strict=True)]))
            for n in (2, 4, 8)
        },
    }


def save_pairs(p: np.ndarray, q: np.ndarray, path: Path) -> None:
    """``p``, ``q`` to ``path`` (``.npz``), written to a temporary file and moved into place."""
    with atomic_path(path, suffix=".npz") as temporary:
        np.savez(temporary, p=p, q=q)


def main(argv: list[str] | None = None, *, model=None, tokenizer=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--steps", type=int, default=32, help="new tokens per prompt")
    parser.add_argument("--drafter", default="early-exit:15")
    parser.add_argument("--out", type=Path, default=Path("pairs.npz"))
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if not args.temperature > 0:
        parser.error(
            f"--temperature must be > 0 (pairs are logged at sampling temperatures), got {args.temperature}"
        )
    p, q = log_pairs(
        args.temperature, drafter=args.drafter, steps=args.steps, model=model, tokenizer=tokenizer
    )
    save_pairs(p, q, args.out)
    from executor.files import write_json

    report = summary(p, q, args.temperature, args.drafter, args.steps)
    write_json(report, args.out.with_suffix(".json"))
    print(
        f"wrote {args.out} and {args.out.with_suffix('.json')}: {report['pairs']} pairs, V = {report['vocab']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
