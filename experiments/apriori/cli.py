"""Arguments and entry point of ``specbound validate`` (the a-priori loop, :mod:`experiments.apriori.run`)."""

from __future__ import annotations

import os

HELP = (
    "calibrate on half of the prompts, predict every decoder's tau and speedup, run the other half, compare "
    "(report.md, results.json, plots)"
)


def add_arguments(parser) -> None:
    from experiments.apriori.calibrate import LATENCY_REPEATS
    from experiments.apriori.run import DECODER_NAMES

    parser.add_argument(
        "--model",
        default=None,
        help="a .gguf file or a Hugging Face llama directory (default: embedded SmolLM2)",
    )
    from experiments.commands.generate import DrafterArgument

    parser.add_argument("--drafter", default=None, action=DrafterArgument)
    parser.add_argument(
        "--quick", action="store_true", help="fewer prompts, tokens and decoders (under 5 minutes)"
    )
    parser.add_argument(
        "--prompts", type=int, default=None, help="HumanEval prompts, split in two halves (default 8)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=None, help="tokens per generation (default 32)")
    parser.add_argument(
        "--calibration-paths",
        type=int,
        default=None,
        help="sampled calibration chains per calibration prompt at T > 0 (default 3; T = 0 runs one)",
    )
    parser.add_argument(
        "--temperatures",
        "--temperature",
        default="0,1",
        help="comma-separated sampling temperatures, each >= 0 (default 0,1)",
    )
    parser.add_argument("--seed", type=int, default=0, help="fixes the prompt split and every random draw")
    parser.add_argument(
        "--decoders", default=None, help=f"comma-separated subset of: {', '.join(DECODER_NAMES)}"
    )
    parser.add_argument(
        "--latency",
        default=None,
        help="latency profile JSON from `specbound profile` (default: measured in the run)",
    )
    parser.add_argument(
        "--latency-repeats",
        type=int,
        default=None,
        help=f"timed rounds of the latency profile measured in the run (default {LATENCY_REPEATS}; fewer are "
        "faster and noisier: with 5 the ratios t(n)/t(1) moved by up to 0.28 between runs)",
    )
    parser.add_argument("--out", default="runs/validate", help="run directory (resumed if it exists)")
    parser.add_argument(
        "--log-out",
        default=None,
        help="also write each evaluation run's drafted (p, q) to this directory, one .npz per run "
        "(docs/logformat.md; read them with `specbound bound --logs 'DIR/*.npz'`)",
    )
    parser.add_argument(
        "--log-top-k", type=int, default=None, help="with --log-out: top-k logs (default full (N, V) logs)"
    )
    parser.add_argument("--restart", action="store_true", help="discard finished units in --out first")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: cores available)"
    )
    from experiments.commands import add_dtype_argument, add_quantize_argument

    add_dtype_argument(parser)
    add_quantize_argument(parser)


def parse_temperatures(text: str) -> tuple[float, ...]:
    """``"0,1"`` -> ``(0.0, 1.0)``; ``ValueError`` naming ``--temperatures`` for anything else."""
    values = []
    for item in str(text).split(","):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"--temperatures: {item!r} is not a number") from None
        if not value >= 0 or value != value or value == float("inf"):
            raise ValueError(
                f"--temperatures: each temperature must be a finite number >= 0, got {item.strip()}"
            )
        values.append(value)
    if len(set(values)) != len(values):
        raise ValueError(f"--temperatures: {text!r} repeats a temperature")
    return tuple(values)


def config_from_args(args):
    """The :class:`~experiments.apriori.run.AprioriConfig` of parsed arguments (checked, quick applied)."""
    from experiments.apriori.run import DECODER_NAMES, QUICK, AprioriConfig

    settings = dict(QUICK) if args.quick else {}
    if args.prompts is not None:
        if args.prompts < 2:
            raise ValueError(
                f"--prompts must be at least 2 (one to calibrate, one to evaluate), got {args.prompts}"
            )
        settings["prompts"] = args.prompts
    if args.max_new_tokens is not None:
        if args.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
        settings["max_new_tokens"] = args.max_new_tokens
    if args.calibration_paths is not None:
        if args.calibration_paths < 1:
            raise ValueError(f"--calibration-paths must be at least 1, got {args.calibration_paths}")
        settings["calibration_paths"] = args.calibration_paths
    settings["temperatures"] = parse_temperatures(args.temperatures)
    if args.decoders:
        wanted = tuple(name.strip() for name in args.decoders.split(",") if name.strip())
        unknown = [name for name in wanted if name not in DECODER_NAMES]
        if unknown:
            raise ValueError(
                f"--decoders: unknown {', '.join(unknown)}; choose from {', '.join(DECODER_NAMES)}"
            )
        settings["decoders"] = wanted
    if args.drafter is not None:
        from executor.drafters import DRAFTER_KINDS
        from executor.drafters.parse import is_lookup_first
        from experiments.commands.generate import drafter_forms

        if is_lookup_first(args.drafter):
            raise ValueError(
                f"--drafter: {args.drafter!r} combines prompt lookup with a model drafter step by step, and "
                "validate has no a-priori model of that mix yet; run it with `specbound generate` or `bench`"
            )
        if args.drafter.partition(":")[0] not in DRAFTER_KINDS:
            raise ValueError(f"--drafter: unknown drafter {args.drafter!r}; use {drafter_forms()}")
    if args.latency_repeats is not None:
        if args.latency_repeats < 1:
            raise ValueError(f"--latency-repeats must be at least 1, got {args.latency_repeats}")
        if args.latency is not None:
            raise ValueError("--latency-repeats times the profile measured in the run; --latency reads one")
        settings["latency_repeats"] = args.latency_repeats
    if args.latency is not None:
        from experiments.apriori.calibrate import read_latency

        read_latency(args.latency)  # fail before the model loads
    settings["multidraft"] = with_optimal_verifier(settings.get("multidraft", AprioriConfig.multidraft))
    return AprioriConfig(
        model=args.model,
        drafter=args.drafter,
        seed=args.seed,
        latency=args.latency,
        dtype=args.dtype,
        quantize=args.quantize,
        **settings,
    )


def with_optimal_verifier(grid: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """Add the optimal verifier (``theory.verifier("optimal")``) at every ``n`` of ``grid`` when the executor
    can run it; its acceptance is the optimum for i.i.d. drafts, the column the multi-draft table compares to."""
    from executor.decoders import TREE_VERIFIERS

    if "optimal" not in TREE_VERIFIERS:
        return tuple(grid)
    sizes = sorted({n for name, n in grid if name != "spechub"})
    return tuple(grid) + tuple(("optimal", n) for n in sizes if ("optimal", n) not in grid)


def run(args) -> int:
    from experiments.apriori.run import run_apriori
    from experiments.commands import check_writable, set_torch_threads

    config = config_from_args(args)
    check_writable(args.out)
    if args.log_top_k is not None and args.log_top_k < 1:
        raise ValueError(f"--log-top-k must be at least 1, got {args.log_top_k}")
    if args.log_top_k is not None and args.log_out is None:
        raise ValueError("--log-top-k needs --log-out")
    if args.log_out is not None:
        check_writable(args.log_out, "--log-out")
    set_torch_threads(args.threads)
    run_apriori(config, args.out, restart=args.restart, log_out=args.log_out, log_top_k=args.log_top_k)
    with open(os.path.join(args.out, "report.md")) as stream:
        print(stream.read())
    print(f"report written to {os.path.join(args.out, 'report.md')} (+ results.json and the PNGs)")
    return 0
