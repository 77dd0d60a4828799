"""Online speculative decoding's acceptance curve: acceptance against prompts served, learning against frozen.

``python -m experiments.online_curve --prompts 12 --max-new-tokens 32 --out DIR`` serves HumanEval
prompts in order to three decoders, interleaved prompt by prompt so machine load hits them alike: plain
decoding, the feature drafter frozen (the control), and the same drafter distilled online after every prompt
(:class:`executor.methods.OnlineSpeculative`). Per prompt it records the drafted tokens accepted, tokens per
step and the seconds (the online update counted in). Writes ``DIR/online.json`` and ``DIR/online.md``
(atomically); the Markdown has the curve (per prompt and its running mean) and the speedups.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

__all__ = ["online_curve", "render_curve"]


def online_curve(model, tokenizer, prompts, *, max_new_tokens: int, temperature: float = 0.0, options=None):
    """Serve ``prompts`` (token-id lists) with plain, frozen and online decoding; one row per prompt."""
    import torch
    from tqdm import tqdm

    from executor.decoders import AutoregressiveDecoder, Sampling
    from executor.methods import OnlineSpeculative

    options = options or {}
    online = OnlineSpeculative(model, tokenizer, **options)
    frozen = OnlineSpeculative(model, tokenizer, **{**options, "learn": False})
    eos = getattr(tokenizer, "eos_id", None)
    rows = []
    for index, prompt in enumerate(tqdm(prompts, desc="online stream", unit="prompt")):
        ar = AutoregressiveDecoder(model, sampling=Sampling(temperature=temperature))
        base = ar.generate(prompt, max_new_tokens, generator=torch.Generator().manual_seed(index), eos_id=eos)
        row = {"served": index + 1, "ar_tokens": len(base.token_ids), "ar_seconds": base.wall_time}
        for label, method in (("frozen", frozen), ("online", online)):
            result = method.run(
                prompt,
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                generator=torch.Generator().manual_seed(index),
                eos_id=eos,
            )
            row[label] = {
                "acceptance": result.extra["draft_acceptance"],
                "tau": result.tau,
                "tokens": len(result.token_ids),
                "seconds": result.wall_time,
                "update_seconds": result.extra["update_seconds"],
                "identical": result.token_ids == base.token_ids,
            }
        rows.append(row)
    return {"options": online.options(), "head": online.head_source, "temperature": temperature, "rows": rows}


def _speed(rows, label: str) -> float:
    tokens = sum(r[label]["tokens"] for r in rows)
    seconds = sum(r[label]["seconds"] for r in rows)
    ar = sum(r["ar_tokens"] for r in rows) / sum(r["ar_seconds"] for r in rows)
    return (tokens / seconds) / ar


def render_curve(report: dict) -> str:
    rows = report["rows"]
    lines = [
        "| served | α frozen | α online | running mean α frozen | running mean α online | τ frozen | τ online "
        "| update s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    means = {"frozen": [], "online": []}
    for row in rows:
        for label in means:
            value = row[label]["acceptance"]
            means[label].append(np.nan if value is None else value)
        lines.append(
            f"| {row['served']} | {row['frozen']['acceptance'] or 0:.3f} | {row['online']['acceptance'] or 0:.3f} "
            f"| {np.nanmean(means['frozen']):.3f} | {np.nanmean(means['online']):.3f} "
            f"| {row['frozen']['tau']:.2f} | {row['online']['tau']:.2f} | {row['online']['update_seconds']:.2f} |"
        )
    half = len(rows) // 2
    summary = []
    for label in ("frozen", "online"):
        late = [r[label]["acceptance"] for r in rows[half:] if r[label]["acceptance"] is not None]
        early = [r[label]["acceptance"] for r in rows[:half] if r[label]["acceptance"] is not None]
        summary.append(
            f"* {label}: mean α first half {np.mean(early):.3f}, second half {np.mean(late):.3f}; "
            f"speedup vs plain decoding {_speed(rows, label):.2f}x (update time included); "
            f"greedy identical {all(r[label]['identical'] for r in rows)}"
        )
    return "\n".join(lines + [""] + summary) + "\n"


def main(argv=None) -> int:
    import torch

    from executor.device import set_threads
    from executor.files import write_json, write_text
    from executor.weights import load_model
    from experiments.prompts import humaneval_prompts

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--skip", type=int, default=0, help="HumanEval problems to skip first")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=4, help="gradient steps per update")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.prompts < 2:
        parser.error("--prompts must be at least 2")
    set_threads(args.threads)
    model, tokenizer = load_model(dtype=torch.float32)
    texts = humaneval_prompts(args.skip + args.prompts)[args.skip :]
    prompts = [tokenizer.encode(text) for text in texts]
    report = online_curve(
        model,
        tokenizer,
        prompts,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        options={"steps": args.steps, "lr": args.lr},
    )
    out = Path(args.out)
    write_json(report, out / "online.json")
    write_text(render_curve(report), out / "online.md")
    print(render_curve(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
