"""``specbound bench``: our decoders against ``transformers`` -- tokens/s, tau, acceptance by position, speedup.

The engine is :mod:`experiments.bench` (interleaved rounds, resume, summary, report), the rows
:mod:`experiments.bench_rows` (models, forward costs, planned trees, runners). This module only turns the
command line into a :class:`experiments.bench_rows.BenchConfig` and runs the phases in order.
"""

from __future__ import annotations

import os

#: New-token counts a compiled target is warmed up on before anything is timed (prefill, one token, chains).
COMPILE_SIZES = (1, 2, 4, 8, 16)

HELP = (
    "tokens/s, tau and acceptance of our decoders (chain, multi-draft, dynamic and planned trees) against "
    "transformers generate, prompt lookup and early-exit assisted generation, at T = 0 and 1"
)


def add_arguments(parser) -> None:
    from experiments.commands import add_compile_argument, add_quantize_argument

    parser.add_argument("--prompts", type=int, default=10, help="prompts of the set (default 10)")
    parser.add_argument(
        "--prompt-set",
        choices=("humaneval", "other"),
        default="humaneval",
        help="humaneval (default) or other: code and prose prompts written here, never tuned on (at most 5)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="times each prompt is run (default 1)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=128, help="tokens generated per prompt and row (default 128)"
    )
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    parser.add_argument(
        "--temperatures", default="0,1", help="comma-separated sampling temperatures (default 0,1)"
    )
    parser.add_argument("--exit-layer", type=int, default=6, help="early-exit layer of both implementations")
    parser.add_argument("--gamma", type=int, default=3, help="drafts per chain step; dynamic tree 2γ+1 nodes")
    parser.add_argument(
        "--lookups", default="2", help="prompt-lookup lengths K, comma-separated (ours and transformers')"
    )
    parser.add_argument(
        "--drafters",
        default=None,
        help="model drafters, comma-separated (early-exit:K, feature[:PATH], model:PATH); default: "
        "early-exit at --exit-layer and the cached trained feature head if there is one",
    )
    parser.add_argument("--ns", default="2,4", help="drafts per step of the multi-draft rows (default 2,4)")
    parser.add_argument(
        "--verifiers",
        default="rrs,optimal",
        help="multi-draft verifiers at T > 0, comma-separated: rrs, rrs_wor, kseq, spechub, greedy, optimal (default rrs,optimal)",
    )
    parser.add_argument("--plan-budget", type=int, default=16, help="largest planned tree (default 16 nodes)")
    parser.add_argument("--plan-depth", type=int, default=6, help="deepest planned tree (default 6)")
    parser.add_argument(
        "--plan-width", type=int, default=4, help="children per node measured and planned (default 4)"
    )
    parser.add_argument("--latency-repeats", type=int, default=5, help="timed rounds of the forward costs")
    parser.add_argument("--context", type=int, default=256, help="context tokens of the forward costs")
    parser.add_argument(
        "--calibration-tokens", type=int, default=32, help="tokens per prompt measuring acceptance per rank"
    )
    parser.add_argument(
        "--rows", default="*", help="row names to run, comma-separated shell patterns (default: all)"
    )
    add_quantize_argument(parser)
    add_compile_argument(parser)
    parser.add_argument(
        "--peer",
        choices=("transformers", "llamacpp"),
        default="transformers",
        help="whose rows run next to ours: transformers (default) or llamacpp (needs specbound[llamacpp]: "
        "llama.cpp plain and prompt-lookup decoding, our int8 ar, and the predicted prompt-lookup speedups)",
    )
    parser.add_argument(
        "--peer-weights",
        default="q4_1,f32,bf16",
        help="llama.cpp's GGUF weights, comma-separated: q4_1 (the embedded file), f32, bf16 (made from it)",
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of round 0 (round r: seed + r)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: cores available)"
    )
    parser.add_argument(
        "--out", default="runs/bench.json", help="JSON file; the Markdown goes next to it (.md)"
    )


def _items(text: str, name: str, kind):
    values = [item.strip() for item in text.split(",") if item.strip()]
    if not values:
        raise ValueError(f"{name} is empty")
    try:
        return tuple(kind(item) for item in values)
    except ValueError:
        raise ValueError(f"{name}: cannot read {text!r} as a comma-separated list") from None


def config_from_args(args):
    """The :class:`~experiments.bench_rows.BenchConfig` of the command line (checks every option)."""
    from experiments.bench_rows import BenchConfig

    return BenchConfig(
        dtypes=_items(args.dtypes, "--dtypes", str),
        temperatures=_items(args.temperatures, "--temperatures", float),
        exit_layer=args.exit_layer,
        gamma=args.gamma,
        lookups=_items(args.lookups, "--lookups", int),
        drafters=None if args.drafters is None else _items(args.drafters, "--drafters", str),
        ns=_items(args.ns, "--ns", int),
        verifiers=_items(args.verifiers, "--verifiers", str),
        plan_budget=args.plan_budget,
        plan_depth=args.plan_depth,
        plan_width=args.plan_width,
        latency_repeats=args.latency_repeats,
        context=args.context,
        calibration_tokens=args.calibration_tokens,
        rows=_items(args.rows, "--rows", str),
        quantize=args.quantize,
        compile=args.compile,
        peer=args.peer,
        peer_weights=_items(args.peer_weights, "--peer-weights", str),
    )


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from experiments import bench_plan, bench_rows
    from experiments.bench import (
        checkpoint_path,
        greedy_divergences,
        read_checkpoint,
        run_bench,
        summarise,
        write_report,
    )
    from experiments.commands import check_writable_file, compile_target, set_torch_threads
    from experiments.profiling import context_ids
    from experiments.prompts import prompt_set

    for name, value in (
        ("--prompts", args.prompts),
        ("--rounds", args.rounds),
        ("--max-new-tokens", args.max_new_tokens),
    ):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    config = config_from_args(args)
    check_writable_file(args.out, "--out")
    texts = prompt_set(args.prompt_set, args.prompts)  # a bad count fails before the models load
    threads = set_torch_threads(args.threads)
    settings = {
        "prompt_set": args.prompt_set,
        "prompts": args.prompts,
        "rounds": args.rounds,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "threads": threads,
        "torch": torch.__version__,
        **config.to_json(),
    }
    checkpoint = checkpoint_path(args.out)
    saved = read_checkpoint(checkpoint, settings)

    targets, peers, tokenizer, compile_seconds = {}, {}, None, {}
    for dtype in config.dtypes:
        model, tokenizer = bench_rows.load_target(dtype, config)
        if config.compile:
            compile_seconds[dtype] = compile_target(
                model, COMPILE_SIZES, enabled=True, label=f"{dtype} target"
            )
        targets[dtype] = (model, bench_rows.model_drafters(config, model))
        peer_rows = ["hf-generate", "hf-early-exit", *(f"hf-prompt-lookup-k{k}" for k in config.lookups)]
        wants_peer = any(config.wants(name) for name in peer_rows)
        wants_peer = wants_peer and config.peer == "transformers"
        peers[dtype] = bench_rows.load_peer(dtype, config) if wants_peer else None
    prompts = [tokenizer.encode(text) for text in texts]
    llms, extra = {}, {}
    if config.peer == "llamacpp":
        llms, extra, seconds = _llamacpp(config, threads, prompts, args.max_new_tokens, targets)
        compile_seconds.update(seconds)
    # Which rows run, before anything is measured (a plan-tree row stands for the tree planned later).
    unplanned = [
        {"drafter": label, "dtype": dtype, "temperature": float(t), "parents": [-1]}
        for dtype, (_, specs) in targets.items()
        for label in specs
        for t in config.temperatures
    ]
    selected = bench_rows.build_runners(config, targets, peers, unplanned)
    selected.update(extra)
    if not selected:
        raise ValueError(f"--rows: no row matches {args.rows!r}")
    context = context_ids(tokenizer, config.context)
    # llama.cpp's t(n) is profiled on its prompt-lookup models: before, between and after the rounds.
    profiled = (
        {weights: llms[(weights, max(config.lookups))] for weights in config.peer_weights} if llms else {}
    )
    stem = os.path.splitext(args.out)[0]
    if saved is not None:
        prepared = saved["prepared"]
        print(f"resuming {checkpoint}: {len(saved['rounds'])} round(s) done")
    else:
        models = {dtype: model for dtype, (model, _) in targets.items()}
        forward, samples = bench_plan.measure_forward(models, context, config, progress=True)
        plans = []
        if any(key.decoder.startswith("plan-tree-") for key in selected):
            plans = bench_plan.plan_rows(targets, samples, prompts, config, stem, progress=True)
        prepared = {"forward": forward, "plans": plans}
        if llms:
            from experiments.bench_llamacpp import prepare

            model = (
                targets["float32"][0]
                if "float32" in targets
                else bench_rows.load_target("float32", config)[0]
            )
            prepared["llamacpp"] = prepare(
                config, profiled, model, prompts, context, args.max_new_tokens, stem
            )
    runners = bench_rows.build_runners(config, targets, peers, prepared["plans"])
    # Greedy rows that verify with our target of their dtype: checked for divergences at rounding ties.
    ours = {key for key in runners if not key.decoder.startswith("hf-")}
    runners.update(extra)
    after_round = None
    if "llamacpp" in prepared:
        from experiments.bench_llamacpp import profile_between_rounds

        after_round = profile_between_rounds(config, profiled, context, prepared["llamacpp"])
    done = run_bench(
        runners,
        prompts,
        args.max_new_tokens,
        rounds=args.rounds,
        seed=args.seed,
        checkpoint=checkpoint,
        fingerprint=settings,
        prepared=prepared,
        progress=lambda pairs: tqdm(pairs, desc="bench", unit="run"),
        after_round=after_round,
    )
    models = {dtype: model for dtype, (model, _) in targets.items()}
    divergences = greedy_divergences(done, prompts, models, ours)
    result = {"settings": settings, "rows": summarise(done, divergences), **prepared}
    if config.compile:  # wall seconds of compilation (or of loading it from Inductor's cache), apart
        result["compile_seconds"] = compile_seconds
    if "llamacpp" in prepared:
        from experiments.bench_llamacpp import own_texts, profile_after, section, write_profiles_during

        part = prepared["llamacpp"]
        measured = {
            **part,
            **profile_after(config, profiled, context, stem),
            **write_profiles_during(part, stem),
        }
        texts = own_texts(done, prompts, config.peer_weights, config.lookups)
        result["llamacpp"] = section(result["rows"], measured, args.max_new_tokens, texts)
    print(write_report(result, args.out))
    return 0


def load_llama(weights: str, lookup, *, threads: int, n_ctx: int):
    """llama.cpp on ``weights`` (a seam for tests: :func:`experiments.peer_llamacpp.load_llama`)."""
    from experiments.peer_llamacpp import load_llama as load

    return load(weights, threads=threads, lookup=lookup, n_ctx=n_ctx)


def _llamacpp(config, threads: int, prompts, max_new_tokens: int, targets):
    """The llama.cpp models ``{(weights, lookup): Llama}`` (every weight format, plain and every K, loaded
    once) and the runners of the llama.cpp rows and ``ar-int8``."""
    from experiments import bench_rows
    from experiments.peer_llamacpp import import_llama_cpp

    import_llama_cpp()  # the install hint before anything loads
    n_ctx = max(len(p) for p in prompts) + max_new_tokens + max(config.lookups) + 16
    n_ctx = max(n_ctx, config.context + 32)
    llms = {}

    def load(weights, lookup):
        if (weights, lookup) not in llms:
            llms[(weights, lookup)] = load_llama(weights, lookup, threads=threads, n_ctx=n_ctx)
        return llms[(weights, lookup)]

    plain, compile_seconds = {}, {}
    if 0.0 in config.temperatures and "float32" in targets:
        plain, compile_seconds = _plain_targets(config)
    runners = bench_rows.llamacpp_runners(config, load, plain_targets=plain)
    for weights in config.peer_weights:  # the profiled models: logits for every position, as lookup runs
        load(weights, max(config.lookups))
    return llms, runners, compile_seconds


def _plain_targets(config):
    """Our extra plain-decoding targets next to llama.cpp: ``ar-int8`` and ``ar-q4_1`` (float32 activations;
    compiled with ``--compile``) and, with ``--compile``, eager twins ``ar-eager``, ``ar-int8-eager``,
    ``ar-q4_1-eager``. Returns ``({row name: model}, {row name: compile seconds})``."""
    from dataclasses import replace

    from experiments import bench_rows
    from experiments.commands import compile_target

    models, seconds = {}, {}
    load = bench_rows.load_target
    for scheme in ("int8", "q4_1") if config.quantize == "none" else ():
        name = f"ar-{scheme}"
        if config.wants(name):
            models[name] = load("float32", replace(config, quantize=scheme))[0]
            seconds[name] = compile_target(models[name], COMPILE_SIZES, enabled=config.compile, label=name)
        if config.compile and config.wants(f"{name}-eager"):  # its own model: compile_model changes one
            models[f"{name}-eager"] = load("float32", replace(config, quantize=scheme))[0]
    if config.compile and config.wants("ar-eager"):
        models["ar-eager"] = load("float32", config)[0]
    return models, seconds
