"""``specbound methods``: every seed method on held-out prompts (see :mod:`experiments.methods_run`)."""

from __future__ import annotations

from experiments.commands import add_dtype_argument, add_quantize_argument

HELP = "run the seed papers' methods side by side with plain decoding and the theory's predictions"


def add_arguments(parser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 calibration + 2 held-out prompts, 16 tokens, plain decoding shared between methods",
    )
    parser.add_argument("--only", default=None, help="comma-separated method names (default: all)")
    add_dtype_argument(parser)
    add_quantize_argument(parser)
    parser.add_argument("--model", default=None, help="a .gguf file or Hugging Face llama directory")
    parser.add_argument("--calibration", type=int, default=None, help="calibration prompts (default 3)")
    parser.add_argument("--prompts", type=int, default=None, help="held-out prompts (default 6)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="tokens per prompt (default 48)")
    parser.add_argument(
        "--seed", type=int, default=0, help="sampling seed; prompt i uses seed + i (default 0)"
    )
    parser.add_argument("--out", required=True, help="run directory (resumed if it exists)")
    parser.add_argument("--restart", action="store_true", help="discard finished units in --out first")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: cores)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="METHOD.OPTION=VALUE",
        help="a method option (JSON value, else a string), e.g. ppd.train_steps=60; repeatable",
    )


def parse_methods(only: str | None) -> tuple[str, ...]:
    import executor.methods as methods

    if only is None:
        return tuple(methods.names())
    wanted = [name.strip() for name in only.split(",") if name.strip()]
    if not wanted:
        raise ValueError("--only needs at least one method name")
    for name in wanted:
        methods.get(name)  # ValueError naming the known methods
    return tuple(dict.fromkeys(wanted))


def config_from_args(args):
    from experiments.methods_run import QUICK, QUICK_OPTIONS, MethodsConfig

    sizes = dict(QUICK) if args.quick else {"calibration": 3, "prompts": 6, "max_new_tokens": 48}
    for name in ("calibration", "prompts", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
            sizes[name] = value
    return MethodsConfig(
        methods=parse_methods(args.only),
        model=args.model,
        dtype=args.dtype,
        quantize=args.quantize,
        seed=args.seed,
        options=_merge_options(QUICK_OPTIONS if args.quick else {}, parse_options(getattr(args, "set", []))),
        **sizes,
    )


def _merge_options(defaults: dict, given: dict) -> dict:
    names = set(defaults) | set(given)
    return {name: {**defaults.get(name, {}), **given.get(name, {})} for name in names}


def parse_options(settings: list[str]) -> dict:
    """``["ppd.train_steps=60", ...]`` -> ``{"ppd": {"train_steps": 60}}`` (values parsed as JSON)."""
    import json

    import executor.methods as methods

    options: dict = {}
    for setting in settings:
        key, equals, value = setting.partition("=")
        name, dot, option = key.partition(".")
        if not (equals and dot and option.isidentifier()):
            raise ValueError(f"--set needs METHOD.OPTION=VALUE, got {setting!r}")
        methods.get(name)  # ValueError naming the known methods
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        options.setdefault(name, {})[option] = parsed
    return options


def run(args) -> int:
    import os

    from experiments.commands import check_writable, set_torch_threads
    from experiments.methods_report import render_markdown
    from experiments.methods_run import run_methods

    config = config_from_args(args)
    check_writable(args.out)
    set_torch_threads(args.threads)
    report = run_methods(config, args.out, restart=args.restart)
    print(render_markdown(report))
    print(f"report written to {os.path.join(args.out, 'methods.md')} (+ methods.json, methods.png)")
    return 0
