"""``specbound profile``: measure this machine's target and drafter costs; write the JSON the planners read.

The measuring is :func:`experiments.profiling.profile_costs`; the JSON format is documented in docs/profile.md
and read by ``specbound plan-tree --latency`` and ``specbound plan-length --latency``.
"""

from __future__ import annotations

import argparse

from experiments.commands import add_compile_argument, add_dtype_argument, add_quantize_argument

HELP = "measure the target's forward time per number of new tokens and the drafter's cost; write latency JSON"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, help="a .gguf file or checkpoint directory (default: SmolLM2-135M)"
    )
    add_dtype_argument(parser)
    add_quantize_argument(parser)
    add_compile_argument(parser)
    parser.add_argument(
        "--drafter",
        default=None,
        help="early-exit:K | ngram | model:PATH | none (default: executor.drafters.default_drafter)",
    )
    parser.add_argument(
        "--context", type=int, default=256, help="tokens of HumanEval prompts prefilled first (default 256)"
    )
    parser.add_argument(
        "--max-size", type=int, default=64, help="largest number of new tokens, a power of two (default 64)"
    )
    parser.add_argument(
        "--max-width", type=int, default=8, help="widest drafter tree level, a power of two (default 8)"
    )
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds (default 15)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: cores available)"
    )
    parser.add_argument(
        "--peer",
        choices=("none", "llamacpp"),
        default="none",
        help="profile llama.cpp instead of our model (needs specbound[llamacpp]; target t(n) and its prompt "
        "lookup's time per step)",
    )
    parser.add_argument(
        "--peer-weights",
        choices=("q4_1", "f32", "bf16"),
        default="q4_1",
        help="llama.cpp's GGUF weights: q4_1 (the embedded file), f32 or bf16 (made from it); default q4_1",
    )
    parser.add_argument("--out", default="latency.json", help="output JSON file (written atomically)")


def load_target(source, dtype, quantize=None):
    """The model and tokenizer to profile (a seam for tests)."""
    from executor.weights import load_model

    return load_model(source, dtype=dtype, quantize=quantize)


def run(args: argparse.Namespace) -> int:
    import datetime
    import platform

    import torch

    from executor.device import detect_hardware, resolve_dtype
    from executor.drafters import default_drafter, parse_drafter
    from executor.files import write_json
    from executor.quantize import resolve_quantize
    from experiments.commands import check_writable_file, compile_target, set_torch_threads
    from experiments.profiling import (
        PROFILE_FORMAT,
        PROFILE_VERSION,
        context_ids,
        power_of_two_sizes,
        profile_costs,
    )

    # Cheap checks first, before the model is loaded.
    check_writable_file(args.out, "--out")
    sizes = power_of_two_sizes(args.max_size, "--max-size")
    widths = power_of_two_sizes(args.max_width, "--max-width")
    if args.context < 2:
        raise ValueError(f"--context must be at least 2 tokens, got {args.context}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be non-negative, got {args.warmup}")
    if args.drafter is not None and args.drafter != "none":
        from executor.drafters import DRAFTER_KINDS

        if args.drafter.partition(":")[0] not in DRAFTER_KINDS:
            raise ValueError(
                f"--drafter: unknown drafter {args.drafter!r}; use early-exit:K, ngram, model:PATH or none"
            )
    threads = set_torch_threads(args.threads)
    if args.peer == "llamacpp":
        return run_llamacpp(args, sizes, threads)
    dtype = resolve_dtype(args.dtype, name="--dtype")
    quantize = resolve_quantize(args.quantize, name="--quantize")
    model, tokenizer = load_target(args.model, dtype, quantize)
    compile_seconds = compile_target(model, sizes, enabled=args.compile)
    context = context_ids(tokenizer, args.context)
    drafter_name = args.drafter or default_drafter(model)
    drafter = None if drafter_name == "none" else parse_drafter(drafter_name, model)
    measured = profile_costs(
        model,
        context,
        drafter=drafter,
        sizes=sizes,
        widths=widths,
        repeats=args.repeats,
        warmup=args.warmup,
        progress=True,
    )
    device = model.tok_embeddings.weight.device
    report = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "model": args.model or "embedded SmolLM2-135M-Instruct",
        "dtype": str(dtype).removeprefix("torch."),
        "quantize": quantize or "none",
        "compiled": compile_seconds is not None,
        "compile_seconds": compile_seconds,
        "device": str(device),
        "threads": threads,
        "hardware": detect_hardware().summary(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **measured,
    }
    write_json(report, args.out)
    print(format_report(report))
    print(f"written to {args.out}")
    return 0


def load_llama(weights: str, threads: int, n_ctx: int):
    """llama.cpp on ``weights`` with logits for every position, as its prompt lookup runs (a seam for tests)."""
    from experiments.peer_llamacpp import load_llama as load

    return load(weights, threads=threads, lookup=1, n_ctx=n_ctx)


def run_llamacpp(args: argparse.Namespace, sizes: list[int], threads: int) -> int:
    """``--peer llamacpp``: llama.cpp's t(n) (:func:`experiments.peer_llamacpp.profile_llamacpp`), same JSON."""
    import datetime
    import platform

    from executor.files import write_json
    from executor.weights import load_tokenizer
    from experiments.peer_llamacpp import import_llama_cpp, profile_llamacpp
    from experiments.profiling import PROFILE_FORMAT, PROFILE_VERSION, context_ids

    if (
        args.model is not None
        or args.drafter is not None
        or args.quantize not in (None, "none")
        or args.compile
    ):
        raise ValueError(
            "--peer llamacpp profiles the embedded model's GGUF: no --model, --drafter, --quantize, --compile"
        )
    llama_cpp = import_llama_cpp()
    context = context_ids(load_tokenizer(), args.context)
    llm = load_llama(args.peer_weights, threads, args.context + sizes[-1] + 16)
    measured = profile_llamacpp(
        {args.peer_weights: llm},
        context,
        sizes=sizes,
        repeats=args.repeats,
        warmup=args.warmup,
        progress=True,
    )[args.peer_weights]
    report = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "model": "embedded SmolLM2-135M-Instruct (llama.cpp)",
        "dtype": args.peer_weights,
        "quantize": "none",
        "device": "cpu",
        "threads": threads,
        "peer": f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')}",
        "machine": platform.processor() or platform.machine(),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **measured,
    }
    write_json(report, args.out)
    print(format_report(report))
    print(f"written to {args.out}")
    return 0


def format_report(report: dict) -> str:
    """The profile as text: target time per size (median, IQR, relative to one token) and the drafter's."""
    target = report["target"]
    quantized = f" ({report['quantize']} weights)" if report.get("quantize", "none") != "none" else ""
    if report.get("compiled"):
        quantized += f", compiled (compile {report['compile_seconds']:.1f} s, not in the times)"
    lines = [
        f"{report['model']}, {report['dtype']}{quantized} on {report['device']}, {report['threads']} threads, "
        f"context {report['context_tokens']} tokens, {report['repeats']} repeats (median, IQR)",
        "",
        f"{'new tokens':>10} {'median ms':>10} {'IQR ms':>8} {'x t(1)':>7}",
    ]
    for row, relative in zip(target["stats"], target["relative"], strict=True):
        lines.append(f"{row['n']:>10} {row['median'] * 1e3:>10.2f} {row['iqr'] * 1e3:>8.2f} {relative:>7.2f}")
    drafter = report.get("drafter")
    if drafter:
        token = drafter["per_token"]
        lines += [
            "",
            f"drafter {drafter['name']}: {token['median'] * 1e3:.2f} ms per drafted token (IQR "
            f"{token['iqr'] * 1e3:.2f}), {drafter['cost_ratio']:.3f} x t(1)",
            f"{'level width':>11} {'median ms':>10} {'IQR ms':>8}",
        ]
        for row in drafter["per_level"]["stats"]:
            lines.append(f"{row['width']:>11} {row['median'] * 1e3:>10.2f} {row['iqr'] * 1e3:>8.2f}")
    return "\n".join(lines)
