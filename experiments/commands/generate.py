"""``specbound generate``: continue a prompt with any decoder; print the text or JSON metrics."""

from __future__ import annotations

import argparse
import json
import sys

from experiments.commands import add_dtype_argument, add_quantize_argument

HELP = "generate a continuation with the autoregressive, chain, multi-draft or tree decoder"

#: The command-line form of each drafter kind of :data:`executor.drafters.DRAFTER_KINDS` (a kind missing here
#: is still listed, by its bare name; ``tests/experiments/test_cli_generate.py`` checks the two agree).
DRAFTER_FORMS = {
    "early-exit": "early-exit:K",
    "ngram": "ngram[:N]",
    "model": "model:PATH",
    "feature": "feature[:PATH]",
    "falcon": "falcon[:PATH]",
    "exit": "exit:K[:PATH]",
    "kangaroo": "kangaroo:K[:PATH]",
}
DRAFTER_DEFAULT = "default: the cached trained feature head, else early-exit at 2/3 of the layers"


def drafter_forms() -> str:
    """``"early-exit:K | ngram[:N] | ..."``: every kind :func:`executor.drafters.parse_drafter` accepts, in
    the order of its ``DRAFTER_KINDS`` (imports torch: call it only when the text is shown)."""
    from executor.drafters import DRAFTER_KINDS

    forms = [DRAFTER_FORMS.get(kind, kind) for kind in DRAFTER_KINDS]
    return " | ".join([*forms, "ngram[:N]+DRAFTER (prompt lookup where it matches, DRAFTER elsewhere)"])


#: The prompt is positional or ``--prompt``: the library's "prompt must ..." names neither (experiments.cli).
PARAMETER_OPTIONS = {"prompt": "the prompt"}


class DrafterArgument(argparse.Action):
    """``--drafter``: stores the string; its help lists :func:`drafter_forms`, built only when help is printed
    (so that parsing the command line does not import torch)."""

    @property
    def help(self) -> str:
        return f"{drafter_forms()} ({DRAFTER_DEFAULT})".replace("%", "%%")

    @help.setter
    def help(self, value) -> None:  # argparse assigns it; the text is always built from DRAFTER_KINDS
        pass

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="?", metavar="PROMPT", help="the text to continue (or --prompt TEXT)")
    parser.add_argument("--prompt", default=None, help="the text to continue, as an option")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument(
        "--model", default=None, help="a .gguf file or checkpoint directory (default: SmolLM2-135M)"
    )
    parser.add_argument(
        "--decoder",
        default="ar",
        choices=["ar", "chain", "multidraft", "tree"],
        help="ar: plain decoding (default); chain: one draft of --gamma tokens; multidraft: -n drafts of one "
        "token; tree: a tree of depth --gamma with -n children per node",
    )
    parser.add_argument("--drafter", default=None, action=DrafterArgument)
    parser.add_argument(
        "--verifier",
        default=None,
        help="rrs | rrs_wor | kseq | spechub | greedy | optimal (multidraft, tree)",
    )
    parser.add_argument(
        "--gamma", type=int, default=4, help="draft length (chain) or tree depth (tree); default 4"
    )
    parser.add_argument(
        "-n",
        "--n",
        type=int,
        default=2,
        help="drafts per step (multidraft) or children per node (tree); default 2",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature; 0 (default) = greedy"
    )
    parser.add_argument("--top-k", type=int, default=None, help="sample from the K most likely tokens only")
    parser.add_argument(
        "--top-p", type=float, default=None, help="sample from the smallest set holding this probability"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the sampling (default 0)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: cores available)"
    )
    add_dtype_argument(parser)
    add_quantize_argument(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print token ids, text, tau, acceptance and tokens/s as JSON (else the text, and one line of "
        "statistics on stderr)",
    )
    parser.add_argument(
        "--log-out", default=None, help="write the drafted positions' p, q (docs/logformat.md)"
    )
    parser.add_argument(
        "--log-top-k", type=int, default=None, help="with --log-out: a top-k log (default full)"
    )


def run(args: argparse.Namespace) -> int:
    from executor.generate import generate
    from experiments.commands import check_writable_file, set_torch_threads

    if (args.text is None) == (args.prompt is None):
        given = "both PROMPT and --prompt" if args.text is not None else "no prompt"
        raise ValueError(f"{given}: give the text to continue once, e.g. specbound generate 'def add(a, b):'")
    prompt = args.text if args.text is not None else args.prompt
    if args.log_top_k is not None and args.log_out is None:
        raise ValueError("--log-top-k needs --log-out")
    if args.log_top_k is not None and args.log_top_k < 1:
        raise ValueError(f"--log-top-k must be at least 1, got {args.log_top_k}")
    if args.log_out is not None:
        check_writable_file(args.log_out, "--log-out")
    set_torch_threads(args.threads)
    result = generate(
        prompt,
        source=args.model,
        dtype=args.dtype,
        quantize=args.quantize,
        chat=args.chat,
        decoder=args.decoder,
        drafter=args.drafter,
        verifier=args.verifier,
        gamma=args.gamma,
        n=args.n,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        **({"log_distributions": "full"} if args.log_out else {}),
    )
    if args.log_out:
        from experiments.logformat import write_generation_log

        write_generation_log([result], args.log_out, top_k=args.log_top_k, temperature=args.temperature)
    if args.json:
        print(json.dumps(result.summary(), indent=2))
    else:
        print(result.text, flush=True)  # before the statistics on stderr, in a terminal too
        print(statistics_line(result), file=sys.stderr)
    return 0


def statistics_line(result) -> str:
    """One line for the terminal: tokens, speed, and for speculative decoders the steps and tau."""
    line = f"{result.n_tokens} tokens in {result.wall_time:.2f} s ({result.tokens_per_second:.1f} tokens/s"
    if result.decoder != "ar":
        line += f"; {len(result.steps)} steps, tau {result.tau:.2f} tokens per step"
    return line + f"; {result.decoder})"
