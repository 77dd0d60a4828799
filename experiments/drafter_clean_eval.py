"""Compare feature heads on standard-library code that none of them trained on.

A checkpoint card's held-out figures come from the first ``held_out_tokens`` (8,192) of its corpus's held-out
split, i.e. from a handful of files, and heads trained on different corpora are scored on different files.
Here every head is scored on the same files: the non-test standard-library files that none of the given
checkpoints' training runs read (a run reads its train split in the corpus's hash order until it has
``train_tokens``, recorded on the card), first ``--tokens`` tokens in a fixed order. Σmin(p, q) at T = 1 on
the drafted ``--positions`` (1: teacher-forced; 2: from the head's own first feature, as it drafts), with a 95%
bootstrap interval over the 512-token chunks, and the paired difference of the first two heads.

    python -m experiments.drafter_clean_eval CHECKPOINT [CHECKPOINT ...] [--tokens 32768] [--positions 1,2]
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    import torch

    from executor.drafters.feature import FeatureDrafter
    from executor.training.checkpoint import read_card
    from executor.training.corpus import Corpus, default_corpus, documents_read, load_corpus
    from executor.training.features import load_features, prepare_features
    from executor.training.trainer import chunk_agreements
    from executor.weights import load_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--tokens", type=int, default=32_768, help="evaluation tokens (default 32768)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--positions", default="1", help="drafted positions, comma-separated (default 1)")
    args = parser.parse_args(argv)
    positions = [int(value) for value in args.positions.split(",")]
    if not all(1 <= position <= 8 for position in positions):
        parser.error(f"--positions must be drafted positions 1 to 8, got {args.positions!r}")
    torch.set_num_threads(args.threads)
    target, tokenizer = load_model()
    stdlib = default_corpus()
    read: set[str] = set()
    for checkpoint in args.checkpoints:
        card = read_card(checkpoint)
        name = card["corpus"]["name"]
        corpus = stdlib if name.startswith("stdlib-") else load_corpus(name)
        docs = documents_read(corpus, tokenizer.encode, card["corpus"]["train_tokens"])
        read |= {doc.removeprefix("stdlib/") for doc in docs}
    order = lambda doc: hashlib.sha256(b"clean:" + doc[0].encode()).digest()  # noqa: E731
    clean = sorted((d for d in stdlib.train + stdlib.held_out if d[0] not in read), key=order)
    print(f"{len(read)} standard-library files read in training; {len(clean)} never read")
    subset = Corpus("stdlib-never-read", clean[:1], clean[1:])
    directory = prepare_features(target, tokenizer, subset, train_tokens=512, held_out_tokens=args.tokens)
    held = load_features(directory, "held_out")
    resample = np.random.default_rng(0).integers(0, len(held), size=(2000, len(held)))
    sums = {position: {} for position in positions}  # position -> head -> (chunks, [sum_min, tokens])
    with torch.no_grad():
        for checkpoint in args.checkpoints:
            head = FeatureDrafter.from_checkpoint(target, checkpoint).head.float().eval()
            chunks = [chunk_agreements(head, target, held, i, max(positions)) for i in range(len(held))]
            for position in positions:
                sums[position][checkpoint.name] = np.array(
                    [(c[position - 1]["sum_min"], c[position - 1]["tokens"]) for c in chunks],
                    dtype=np.float64,
                )
    for position in positions:
        print(f"drafted position {position}:")
        _report(sums[position], resample)
    return 0


def _report(sums: dict, resample: np.ndarray) -> None:
    """Σmin of each head with its bootstrap interval, and the paired difference of the first two heads."""

    def estimate(rows, index=slice(None)):
        return rows[index, 0].sum(-1) / rows[index, 1].sum(-1)

    for name, rows in sums.items():
        low, high = np.percentile(estimate(rows, resample), [2.5, 97.5])
        print(
            f"  {name}: sum_min {estimate(rows):.3f} [{low:.3f}, {high:.3f}] over {int(rows[:, 1].sum())} tokens"
        )
    if len(sums) >= 2:
        (first, a), (second, b) = list(sums.items())[:2]
        low, high = np.percentile(estimate(a, resample) - estimate(b, resample), [2.5, 97.5])
        print(f"  {first} - {second}: {estimate(a) - estimate(b):+.3f} [{low:+.3f}, {high:+.3f}] (paired)")


if __name__ == "__main__":
    raise SystemExit(main())
