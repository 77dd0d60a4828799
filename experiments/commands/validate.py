"""``specbound validate``: the main job (see :mod:`experiments.validate`)."""

from __future__ import annotations

HELP = "run the decoders on the embedded model and report the theory's predictions against measurements"


def add_arguments(parser) -> None:
    from experiments.commands import add_dtype_argument
    from experiments.validate import DEFAULT_DECODERS, ValidationConfig

    defaults = ValidationConfig()
    labels = ", ".join(spec.label for spec in DEFAULT_DECODERS)
    parser.add_argument(
        "--model",
        default=None,
        help="a .gguf file or a Hugging Face llama directory (default: the embedded SmolLM2-135M-Instruct)",
    )
    parser.add_argument(
        "--drafter",
        default=None,
        help="early-exit:K | ngram | model:PATH (default: early exit at 2/3 of the layers)",
    )
    parser.add_argument("--prompts", type=int, default=defaults.prompts, help="number of HumanEval prompts")
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--decoders", default=None, help=f"comma-separated subset of: {labels}")
    parser.add_argument("--out", default="runs/validate", help="run directory (resumed if it exists)")
    parser.add_argument("--restart", action="store_true", help="discard finished units in --out first")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: cores available)"
    )
    add_dtype_argument(parser)


def run(args) -> int:
    import os

    from experiments.commands import set_torch_threads
    from experiments.validate import DEFAULT_DECODERS, ValidationConfig, run_validation

    if args.prompts < 1:
        raise ValueError(f"--prompts must be at least 1, got {args.prompts}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if not args.temperature > 0:
        raise ValueError(
            f"--temperature must be positive (the theory is about sampling), got {args.temperature}"
        )
    specs = DEFAULT_DECODERS
    if args.decoders:
        by_label = {spec.label: spec for spec in DEFAULT_DECODERS}
        wanted = [label.strip() for label in args.decoders.split(",") if label.strip()]
        unknown = [label for label in wanted if label not in by_label]
        if unknown:
            raise ValueError(f"--decoders: unknown {', '.join(unknown)}; choose from {', '.join(by_label)}")
        specs = tuple(by_label[label] for label in wanted)
    set_torch_threads(args.threads)
    config = ValidationConfig(
        model=args.model,
        drafter=args.drafter,
        prompts=args.prompts,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        decoders=specs,
        dtype=args.dtype,
    )
    report = run_validation(config, args.out, restart=args.restart)
    from experiments.validate import render_markdown

    print(render_markdown(report))
    print(f"report written to {os.path.join(args.out, 'report.md')} (+ report.json, acceptance.png)")
    return 0
