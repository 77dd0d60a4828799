"""``specbound bench``: tokens per second of our best decoders against ``transformers`` on the same prompts.

Rows, for each dtype (float32 and bfloat16 by default), all greedy on the same GGUF weights, same threads:

* ``hf-generate`` -- ``transformers`` ``generate`` (plain decoding), the baseline of the ratios;
* ``hf-prompt-lookup`` -- ``generate(prompt_lookup_num_tokens=K)`` (prompt lookup decoding, Saxena 2023);
* ``hf-early-exit`` -- ``generate(assistant_early_exit=L)`` (LayerSkip self-speculation, Elhoushi et al.,
  ACL 2024, arXiv 2404.16710, as assisted generation);
* ``ar`` -- our autoregressive decoder; ``chain-ngram``, ``chain-early-exit``, ``tree-early-exit`` -- our
  speculative decoders with the same drafters; ``chain-feature``, ``tree-feature`` -- with the trained feature
  head (EAGLE/Falcon family), when one is cached (``specbound train-drafter --kind feature``).

Every prompt runs every row once, in turn, the order rotated from prompt to prompt (interleaved: a change of
machine load hits every row alike, and no row is always first). Tokens per second = generated tokens / wall
time, prefill included, summed over prompts; each row's ratio is against ``hf-generate`` and ``ar`` of the same
dtype, measured in the same run. The engine (:func:`run_bench`, :func:`summarise`) takes any runners, so that
it is tested without a model.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["build_runners", "render_markdown", "run_bench", "summarise"]

#: ``runner(prompt_ids, max_new_tokens) -> (generated tokens, seconds)``
Runner = Callable[[list[int], int], tuple[int, float]]


def run_bench(
    runners: dict[str, Runner], prompts: list[list[int]], max_new_tokens: int, *, progress=None
) -> dict:
    """Run every runner on every prompt, interleaved and rotated; returns ``{name: {"tokens", "seconds"}}``.

    Each runner first generates 4 tokens from the first prompt, untimed (allocations, lazy initialisation).
    """
    if not runners or not prompts:
        raise ValueError("runners and prompts must be non-empty")
    names = list(runners)
    for name in names:
        runners[name](prompts[0], min(4, max_new_tokens))
    totals = {name: {"tokens": 0, "seconds": 0.0} for name in names}
    iterator = progress(prompts) if progress else prompts
    for index, prompt in enumerate(iterator):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            tokens, seconds = runners[name](prompt, max_new_tokens)
            totals[name]["tokens"] += int(tokens)
            totals[name]["seconds"] += float(seconds)
    return totals


def summarise(totals: dict[str, dict]) -> list[dict]:
    """Rows with tokens/s and the ratios to ``hf-generate`` and ``ar`` of the same dtype (names ``row@dtype``)."""
    speed = {
        name: t["tokens"] / t["seconds"] if t["seconds"] > 0 else float("nan") for name, t in totals.items()
    }
    rows = []
    for name, t in totals.items():
        label, _, dtype = name.partition("@")
        suffix = f"@{dtype}" if dtype else ""
        rows.append(
            {
                "decoder": label,
                "dtype": dtype or None,
                "tokens": t["tokens"],
                "seconds": t["seconds"],
                "tokens_per_s": speed[name],
                "vs_hf_generate": speed[name] / speed.get(f"hf-generate{suffix}", float("nan")),
                "vs_ar": speed[name] / speed.get(f"ar{suffix}", float("nan")),
            }
        )
    return rows


def render_markdown(result: dict) -> str:
    settings = result["settings"]
    lines = [
        "# specbound bench: tokens per second against transformers",
        "",
        f"{settings['prompts']} HumanEval prompts, {settings['max_new_tokens']} new tokens, greedy, "
        f"{settings['threads']} threads; rows interleaved per prompt. Ratios against `hf-generate` and our `ar` "
        "of the same dtype, same run."
        + (
            f" Our decoders run the {settings['quantize']} target (weight-only), transformers the float one."
            if settings.get("quantize", "none") != "none"
            else ""
        ),
        "",
        "| decoder | dtype | tokens/s | vs hf-generate | vs ar |",
        "|---|---|---:|---:|---:|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['decoder']} | {row['dtype']} | {row['tokens_per_s']:.2f} | {row['vs_hf_generate']:.2f} "
            f"| {row['vs_ar']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _hf_runner(model, pad_id: int, options: dict) -> Runner:
    import torch

    def run(prompt_ids: list[int], max_new_tokens: int) -> tuple[int, float]:
        ids = torch.tensor([prompt_ids])
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                **options,
            )
        return out.shape[1] - ids.shape[1], time.perf_counter() - start

    return run


def _our_runner(decoder) -> Runner:
    def run(prompt_ids: list[int], max_new_tokens: int) -> tuple[int, float]:
        result = decoder.generate(prompt_ids, max_new_tokens)
        return result.n_tokens, result.wall_time

    return run


def build_runners(
    dtypes, *, exit_layer: int, lookup: int = 2, gamma: int = 3, quantize: str | None = None
) -> tuple[dict[str, Runner], object]:
    """The runners of the module docstring for each dtype, and our tokenizer (to encode the prompts).

    ``quantize="int8"`` runs our decoders on the weight-only int8 target (:mod:`executor.quantize`; ``ar`` is
    then int8 plain decoding); the ``transformers`` rows stay in the float dtype.
    """
    import torch

    from executor.decoders import AutoregressiveDecoder, ChainDecoder, DynamicTree, TreeDecoder
    from executor.drafters import EarlyExitDrafter, PromptLookupDrafter, parse_drafter
    from executor.drafters.parse import feature_checkpoint
    from executor.weights import load_model
    from experiments.peers import load_transformers_model

    runners: dict[str, Runner] = {}
    tokenizer = None
    for name in dtypes:
        dtype = getattr(torch, name)
        model, tokenizer = load_model(device="cpu", dtype=dtype, quantize=quantize)
        hf_model, hf_tokenizer = load_transformers_model(dtype=dtype)
        pad = hf_tokenizer.eos_token_id
        runners[f"hf-generate@{name}"] = _hf_runner(hf_model, pad, {})
        runners[f"hf-prompt-lookup@{name}"] = _hf_runner(hf_model, pad, {"prompt_lookup_num_tokens": lookup})
        runners[f"hf-early-exit@{name}"] = _hf_runner(hf_model, pad, {"assistant_early_exit": exit_layer})
        runners[f"ar@{name}"] = _our_runner(AutoregressiveDecoder(model))
        runners[f"chain-ngram@{name}"] = _our_runner(ChainDecoder(model, PromptLookupDrafter(), gamma=lookup))
        draft = EarlyExitDrafter(model, exit_layer)
        runners[f"chain-early-exit@{name}"] = _our_runner(ChainDecoder(model, draft, gamma=gamma))
        runners[f"tree-early-exit@{name}"] = _our_runner(
            TreeDecoder(model, draft, tree=DynamicTree(budget=2 * gamma + 1, max_depth=gamma, branching=2))
        )
        checkpoint = feature_checkpoint(model, train_if_missing=False)
        if checkpoint is not None:  # the trained feature head (`specbound train-drafter --kind feature`)
            spec = f"feature:{checkpoint}"
            runners[f"chain-feature@{name}"] = _our_runner(
                ChainDecoder(model, parse_drafter(spec, model), gamma=gamma)
            )
            runners[f"tree-feature@{name}"] = _our_runner(
                TreeDecoder(model, parse_drafter(spec, model), tree=DynamicTree(2 * gamma + 1, gamma, 2))
            )
    return runners, tokenizer
