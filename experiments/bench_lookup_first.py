"""Choose ``ngram+D``'s two settings: the shortest trusted suffix match and the model drafter's chain length.

``python -m experiments.bench_lookup_first [--first 100] [--prompts 8] [--temperature 0] [--out FILE.json]``
runs, interleaved and in one process, plain decoding, prompt lookup alone (γ = 6), the drafter alone (γ = 1) and
:class:`executor.drafters.LookupFirstDrafter` for ``min_ngram`` in 1, 2, 3 and ``model_tokens`` in 1, 2, 3
(lookup up to 6 tokens), on HumanEval problems ``first .. first + prompts - 1`` (``--prompt-set other``: the
prompts of :data:`experiments.prompts.OTHER_PROMPTS` instead, to measure, never to tune). The defaults of
:mod:`executor.drafters.parse` were chosen from this script's run on problems 100-107, so that the benchmarks
that report them (problems 0-7 and the prompts of :data:`experiments.prompts.OTHER_PROMPTS`) were not tuned on.
Prints tokens/s, the ratio to plain decoding and τ per configuration; each decoder's first prompt is run once
untimed first (oneDNN builds its kernels at the first pass of each shape). ``--compile`` runs the target
compiled, as ``specbound bench --compile`` does (the compile time is printed, not timed).
"""

from __future__ import annotations

import argparse
import itertools

import torch

from executor.decoders import AutoregressiveDecoder, ChainDecoder, Sampling
from executor.device import set_threads
from executor.drafters import LookupFirstDrafter, PromptLookupDrafter, parse_drafter
from executor.files import write_json
from executor.weights import load_model
from experiments.commands import add_compile_argument, compile_target
from experiments.commands.bench import COMPILE_SIZES
from experiments.prompts import humaneval_prompts, prompt_set

LOOKUP_TOKENS = 6


def decoders(model, drafter, sampling: Sampling) -> dict:
    """``{name: decoder}``: ``ar``, ``ngram``, the drafter alone and every ``min_ngram`` x ``model_tokens``."""
    built = {
        "ar": AutoregressiveDecoder(model, sampling=sampling),
        "ngram": ChainDecoder(model, PromptLookupDrafter(), gamma=LOOKUP_TOKENS, sampling=sampling),
        "drafter-g1": ChainDecoder(model, drafter, gamma=1, sampling=sampling),
    }
    for min_ngram, model_tokens in itertools.product((1, 2, 3), (1, 2, 3)):
        combined = LookupFirstDrafter(
            PromptLookupDrafter(min_ngram=min_ngram), drafter, model_tokens=model_tokens
        )
        built[f"min{min_ngram}-model{model_tokens}"] = ChainDecoder(
            model, combined, gamma=LOOKUP_TOKENS, sampling=sampling
        )
    return built


def measure(built: dict, prompts: list[list[int]], new_tokens: int) -> dict:
    """Tokens/s, ratio to ``ar`` and τ per decoder; the order is reversed on every other prompt."""
    seconds, tokens, steps = dict.fromkeys(built, 0.0), dict.fromkeys(built, 0), dict.fromkeys(built, 0)
    for decoder in built.values():  # warm-up, untimed
        decoder.generate(prompts[0], new_tokens, generator=torch.Generator().manual_seed(0))
    for index, prompt in enumerate(prompts):
        for name in list(built) if index % 2 == 0 else list(built)[::-1]:
            result = built[name].generate(prompt, new_tokens, generator=torch.Generator().manual_seed(index))
            seconds[name] += result.wall_time
            tokens[name] += len(result.token_ids)
            steps[name] += len(result.steps)
    plain = tokens["ar"] / seconds["ar"]
    return {
        name: {
            "tokens_per_s": round(tokens[name] / seconds[name], 2),
            "vs_ar": round(tokens[name] / seconds[name] / plain, 3),
            "tau": round(tokens[name] / steps[name], 3),
        }
        for name in built
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int, default=100, help="first HumanEval problem (default 100)")
    parser.add_argument("--prompts", type=int, default=8, help="number of problems (default 8)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--drafter", default="feature", help="the model drafter D (default: feature)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--prompt-set",
        default="humaneval",
        choices=["humaneval", "other"],
        help="other: the first --prompts of 5",
    )
    parser.add_argument("--out", default=None, help="write the table as JSON here")
    add_compile_argument(parser)
    args = parser.parse_args(argv)
    if args.prompt_set == "other":
        try:
            texts = prompt_set("other", args.prompts)
        except ValueError as error:
            parser.error(f"--prompts: {error}")
    else:
        if not 0 <= args.first or not 1 <= args.prompts or args.first + args.prompts > 164:
            parser.error("--first and --prompts must select problems within HumanEval's 164")
        texts = humaneval_prompts(args.first + args.prompts)[args.first :]
    set_threads(args.threads)
    model, tokenizer = load_model(dtype=getattr(torch, args.dtype))
    compile_target(model, COMPILE_SIZES, enabled=args.compile)
    prompts = [tokenizer.encode(text) for text in texts]
    built = decoders(model, parse_drafter(args.drafter, model), Sampling(temperature=args.temperature))
    table = measure(built, prompts, args.new_tokens)
    for name, row in table.items():
        print(f"{name:14s} {row['tokens_per_s']:7.2f} tok/s  {row['vs_ar']:.3f}x  tau {row['tau']:.3f}")
    if args.out:
        write_json({"settings": vars(args), "rows": table}, args.out)


if __name__ == "__main__":
    main()
