"""Executor benchmark: our decoders against ``transformers`` on HumanEval prompts, greedy, same process.

Rows (all greedy, same weights, same thread count, measured side by side, in turn on every prompt):

* ``hf-generate``        -- ``transformers`` ``generate`` on the same GGUF weights (plain decoding);
* ``hf-prompt-lookup``   -- ``transformers`` assisted generation with prompt lookup
  (``prompt_lookup_num_tokens``);
* ``ar``                 -- our autoregressive decoder;
* ``chain-ngram-g2/g5``  -- our chain decoder with the prompt-lookup drafter, 2 or 5 tokens;
* ``chain-early-exit``   -- our chain decoder drafting with the target's first K layers;
* ``tree-early-exit``    -- our dynamic tree decoder with the early-exit drafter.

Speed is reported as tokens/s (generated tokens / wall time, prefill included, summed over prompts) and as
ratios to ``ar`` and ``hf-generate`` from the same run. Every row runs in one dtype (``--dtype``, default
:func:`executor.device.default_dtype`), ``transformers`` included, so both ratios compare like with like. Run::

    python -m experiments.bench_executor [--prompts 10] [--max-new-tokens 128] [--threads N] \
        [--dtype float32|bfloat16] [--out runs/bench_executor.json]
"""

from __future__ import annotations

import argparse
import time

import torch
from tqdm import tqdm

from executor.decoders import AutoregressiveDecoder, ChainDecoder, DynamicTree, TreeDecoder
from executor.device import resolve_dtype, set_threads
from executor.drafters import EarlyExitDrafter, PromptLookupDrafter
from executor.files import write_json
from executor.weights import load_model
from experiments.commands import add_dtype_argument
from experiments.peers import load_transformers_model
from experiments.prompts import humaneval_prompts


def our_decoders(model, exit_layer: int) -> dict:
    return {
        "ar": AutoregressiveDecoder(model),
        # Verifying 2-3 tokens costs about one on a CPU (31 vs 32 ms at 2 threads), 6 tokens 1.6x: short
        # prompt-lookup chains pay best here, so both lengths are measured.
        "chain-ngram-g2": ChainDecoder(model, PromptLookupDrafter(), gamma=2),
        "chain-ngram-g5": ChainDecoder(model, PromptLookupDrafter(), gamma=5),
        "chain-early-exit": ChainDecoder(model, EarlyExitDrafter(model, exit_layer), gamma=3),
        "tree-early-exit": TreeDecoder(model, EarlyExitDrafter(model, exit_layer), tree=DynamicTree(7, 3, 2)),
    }


def hf_runner(hf_model, hf_tokenizer, prompt_lookup: bool):
    def run(prompt_ids: list[int], max_new_tokens: int) -> tuple[int, float, float]:
        ids = torch.tensor([prompt_ids])
        options = {"prompt_lookup_num_tokens": 5} if prompt_lookup else {}
        start = time.perf_counter()
        with torch.no_grad():
            out = hf_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=hf_tokenizer.eos_token_id,
                **options,
            )
        return out.shape[1] - ids.shape[1], time.perf_counter() - start, float("nan")

    return run


def our_runner(decoder):
    def run(prompt_ids: list[int], max_new_tokens: int) -> tuple[int, float, float]:
        result = decoder.generate(prompt_ids, max_new_tokens)
        return result.n_tokens, result.wall_time, result.tau

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--exit-layer", type=int, default=6)
    parser.add_argument("--threads", type=int, default=None, help="default: the cores available")
    add_dtype_argument(parser)
    parser.add_argument("--out", default="runs/bench_executor.json")
    args = parser.parse_args(argv)
    args.threads = set_threads(args.threads, name="--threads")
    dtype = resolve_dtype(args.dtype, "cpu", name="--dtype")
    args.dtype = str(dtype).removeprefix("torch.")

    model, tokenizer = load_model(device="cpu", dtype=dtype)
    hf_model, hf_tokenizer = load_transformers_model(dtype=dtype)
    runners = {
        "hf-generate": hf_runner(hf_model, hf_tokenizer, prompt_lookup=False),
        "hf-prompt-lookup": hf_runner(hf_model, hf_tokenizer, prompt_lookup=True),
        **{name: our_runner(d) for name, d in our_decoders(model, args.exit_layer).items()},
    }
    prompts = [tokenizer.encode(text) for text in humaneval_prompts(args.prompts)]
    for runner in runners.values():  # warm-up (allocations, lazy initialisation)
        runner(prompts[0], 8)
    totals = {name: {"tokens": 0, "seconds": 0.0, "tau": []} for name in runners}
    for prompt in tqdm(prompts, desc="bench_executor", unit="prompt"):
        for name, runner in runners.items():  # interleaved, so that load changes hit every row alike
            tokens, seconds, tau = runner(prompt, args.max_new_tokens)
            totals[name]["tokens"] += tokens
            totals[name]["seconds"] += seconds
            totals[name]["tau"].append(tau)

    rows = []
    speed = {name: t["tokens"] / t["seconds"] for name, t in totals.items()}
    for name, t in totals.items():
        taus = [x for x in t["tau"] if x == x]
        rows.append(
            {
                "decoder": name,
                "tokens": t["tokens"],
                "seconds": t["seconds"],
                "tokens_per_second": speed[name],
                "tau": sum(taus) / len(taus) if taus else None,
                "vs_ar": speed[name] / speed["ar"],
                "vs_hf_generate": speed[name] / speed["hf-generate"],
            }
        )
    print(f"{'decoder':<20}{'tok/s':>9}{'tau':>7}{'vs ar':>8}{'vs hf':>8}")
    for row in rows:
        tau = f"{row['tau']:.2f}" if row["tau"] is not None else "-"
        print(
            f"{row['decoder']:<20}{row['tokens_per_second']:>9.2f}{tau:>7}{row['vs_ar']:>8.2f}{row['vs_hf_generate']:>8.2f}"
        )
    write_json(
        {
            "settings": {**vars(args), "torch": torch.__version__},
            "rows": rows,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
