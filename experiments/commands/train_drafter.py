"""``specbound train-drafter``: train a draft head on the target's cached features within a time budget."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = (
    "train a drafter (feature, falcon, exit:K, kangaroo:K) on the standard library or --corpus, in --minutes"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kind",
        default="feature",
        help="feature, falcon, exit:K[,K...] (one exit head per layer, trained in one job) or kangaroo:K",
    )
    parser.add_argument("--minutes", type=float, default=6.0, help="optimisation budget (default 6)")
    parser.add_argument(
        "--corpus",
        default=None,
        help="a directory of text/code files, a .jsonl of texts, or self:N (N tokens the target generates at "
        "T = 1 from stdlib-code and prose starts, then the stdlib; cached, resumable) (default: stdlib)",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="precision of the target's weights (default float32); bfloat16 rounds them first, as a bfloat16 "
        "target holds them. Features and training are computed in float32 either way, and the feature cache "
        "and checkpoint key do not depend on it: a head serves the model in both dtypes",
    )
    parser.add_argument("--out", default=None, help="checkpoint directory (default: the XDG cache, keyed)")
    parser.add_argument(
        "--model", default=None, help="a .gguf file or checkpoint directory (default: SmolLM2)"
    )
    parser.add_argument(
        "--train-tokens", type=int, default=65_536, help="training tokens to prefill (default 65536)"
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=0,
        help="also stop after this many optimizer steps; the learning-rate schedule then runs on steps, so two "
        "runs compare at equal steps (default 0: the --minutes budget alone)",
    )
    parser.add_argument(
        "--teacher-topk",
        type=int,
        default=32,
        help="cache the target's top-k probabilities plus the tail mass once and distil on those buckets "
        "(default 32; 0 recomputes the full distribution at every step)",
    )
    parser.add_argument(
        "--unroll",
        type=int,
        default=1,
        help="feature kind: drafted positions trained per entry; 2 or more also trains the head on its own "
        "features, as it drafts (EAGLE-3's training-time test; default 1: teacher-forced only)",
    )
    parser.add_argument(
        "--vocab", default="auto", choices=["auto", "full", "reduced"], help="draft vocabulary"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: all available)"
    )
    parser.add_argument("--json", action="store_true", help="print the checkpoint card as JSON")
    parser.add_argument(
        "--rank",
        action="store_true",
        help="train nothing: score every cached feature and falcon head of the model on the common ranking set "
        "(standard-library held-out files; once per head, stored in its card) and print the order --drafter uses",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from executor.training.checkpoint import read_card
    from executor.training.trainer import TrainConfig, train_drafter
    from executor.weights import load_model
    from experiments.commands import check_writable, set_torch_threads

    if not args.minutes > 0:
        raise ValueError(f"--minutes must be positive, got {args.minutes}")
    if args.max_steps < 0 or args.teacher_topk < 0:
        raise ValueError(
            f"--max-steps and --teacher-topk must be non-negative, got {args.max_steps}, {args.teacher_topk}"
        )
    if not 1 <= args.unroll <= 8:
        raise ValueError(f"--unroll must be 1 to 8 drafted positions, got {args.unroll}")
    if args.unroll != 1 and args.kind != "feature":
        raise ValueError(
            f"--unroll applies to --kind feature only, got --kind {args.kind} --unroll {args.unroll}"
        )
    if args.train_tokens < 1024:
        raise ValueError(f"--train-tokens must be at least 1024, got {args.train_tokens}")
    from executor.training.selfdistill import parse_self_corpus

    parse_self_corpus(args.corpus)  # a bad self:N fails before the model loads
    if args.out is not None and not args.rank:
        check_writable(args.out)
    set_torch_threads(args.threads)
    model, tokenizer = load_model(args.model, device="cpu", dtype=getattr(torch, args.dtype))
    if args.rank:
        return _rank(model, tokenizer, args.json)
    try:
        path = train_drafter(
            model,
            tokenizer,
            kind=args.kind,
            corpus=args.corpus,
            minutes=args.minutes,
            out=args.out,
            train_tokens=args.train_tokens,
            config=TrainConfig(
                minutes=args.minutes,
                vocab=args.vocab,
                max_steps=args.max_steps,
                teacher_topk=args.teacher_topk,
                unroll=args.unroll,
            ),
        )
    except KeyboardInterrupt:
        print("specbound train-drafter: interrupted; run the same command again to resume")
        return 130
    card = read_card(path)
    if args.json:
        print(json.dumps(card, indent=2))
    else:
        held = card["held_out"]
        print(
            f"{args.kind} drafter saved to {path}\n"
            f"held-out ({held['tokens']} tokens, T = 1): top-1 {held['top1']:.3f}, "
            f"sum-min(p, q) {held['sum_min']:.3f}, KL {held['kl']:.3f}; {card['steps']} steps, "
            f"{card['tokens']} tokens, {card['seconds']} s; draft vocabulary {card['draft_vocab']['chosen']}"
        )
        if "sum_min_2" in held:
            print(
                f"second drafted position, from the head's own first feature: top-1 {held['top1_2']:.3f}, "
                f"sum-min(p, q) {held['sum_min_2']:.3f}"
            )
        if "ranking" in card:
            from executor.training.ranking import common_scores

            score = common_scores({path.name: card["ranking"]})[0][path.name]
            print(
                f"common ranking set (standard-library held-out files): {_describe(score)}; "
                "`specbound train-drafter --rank` compares the cached heads"
            )
        if "held_out_token2" in card:
            second = card["held_out_token2"]
            print(
                f"token 2 of each pass: top-1 {second['top1']:.3f}, sum-min(p, q) {second['sum_min']:.3f}, "
                f"KL {second['kl']:.3f}"
            )
    return 0


def _rank(model, tokenizer, as_json: bool) -> int:
    """Score the unscored cached heads on the ranking set, then print each kind's order."""
    from executor.training.ranking import RANKED_KINDS, rank_checkpoints, score_checkpoint
    from executor.training.trainer import cached_checkpoints

    report = {}
    for kind in RANKED_KINDS:
        paths = cached_checkpoints(model, kind)
        for path in paths:
            score_checkpoint(path, model, tokenizer)  # only the heads not scored yet
        order, table = rank_checkpoints(paths)
        report[kind] = {"order": [str(p) for p in order], **table}
    if as_json:
        print(json.dumps(report, indent=2))
        return 0
    for kind, table in report.items():
        if not table["order"]:
            print(f"{kind}: no cached head for this model")
            continue
        print(
            f"{kind}: ranked on {len(table['files'])} standard-library held-out files none of them read "
            f"(T = 1, first drafted position); --drafter {kind} uses the first"
        )
        for rank, path in enumerate(table["order"], start=1):
            print(f"  {rank}. {Path(path).name}: {_describe(table['scores'][Path(path).name])}")
    return 0


def _describe(score: dict) -> str:
    """One ranking score (:func:`executor.training.ranking.common_scores`) as text."""
    low, high = score["sum_min_ci"]
    return (
        f"sum-min(p, q) {score['sum_min']:.3f} [{low:.3f}, {high:.3f}], top-1 {score['top1']:.3f} "
        f"over {score['tokens']} tokens"
    )
