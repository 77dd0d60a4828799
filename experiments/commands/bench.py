"""``specbound bench``: our decoders against ``transformers``, tokens per second (see :mod:`experiments.bench`)."""

from __future__ import annotations

from experiments.commands import add_quantize_argument

HELP = (
    "tokens/s of our decoders against transformers generate, prompt lookup and early-exit assisted generation"
)

DTYPES = ("float32", "bfloat16")


def add_arguments(parser) -> None:
    parser.add_argument("--prompts", type=int, default=10, help="prompts of the set (default 10)")
    parser.add_argument(
        "--prompt-set",
        choices=("humaneval", "other"),
        default="humaneval",
        help="humaneval (default) or other: code and prose prompts written here, never tuned on (at most 5)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    add_quantize_argument(parser)
    parser.add_argument("--exit-layer", type=int, default=6, help="early-exit layer of both implementations")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: cores available)"
    )
    parser.add_argument(
        "--out", default="runs/bench.json", help="JSON file; the Markdown goes next to it (.md)"
    )


def run(args) -> int:
    import os

    import torch
    from tqdm import tqdm

    from executor.files import write_json
    from executor.quantize import resolve_quantize
    from experiments.apriori.cli import check_writable
    from experiments.bench import build_runners, render_markdown, run_bench, summarise
    from experiments.commands import set_torch_threads
    from experiments.prompts import prompt_set

    if args.prompts < 1:
        raise ValueError(f"--prompts must be at least 1, got {args.prompts}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in dtypes if d not in DTYPES]
    if not dtypes or unknown:
        raise ValueError(
            f"--dtypes: unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(DTYPES)}"
        )
    if args.exit_layer < 1:
        raise ValueError(f"--exit-layer must be at least 1, got {args.exit_layer}")
    check_writable(os.path.dirname(os.path.abspath(args.out)))
    texts = prompt_set(args.prompt_set, args.prompts)  # a bad count fails before the models load
    threads = set_torch_threads(args.threads)
    quantize = resolve_quantize(args.quantize, name="--quantize")
    runners, tokenizer = build_runners(dtypes, exit_layer=args.exit_layer, quantize=quantize)
    prompts = [tokenizer.encode(text) for text in texts]
    totals = run_bench(
        runners, prompts, args.max_new_tokens, progress=lambda items: tqdm(items, desc="bench", unit="prompt")
    )
    settings = {**vars(args), "threads": threads, "torch": torch.__version__}
    settings.pop("run", None)
    result = {"settings": settings, "rows": summarise(totals)}
    write_json(result, args.out)
    markdown = render_markdown(result)
    temporary = os.path.splitext(args.out)[0] + ".md.tmp"
    with open(temporary, "w") as stream:
        stream.write(markdown)
    os.replace(temporary, os.path.splitext(args.out)[0] + ".md")
    print(markdown)
    return 0
