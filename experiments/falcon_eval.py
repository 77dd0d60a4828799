"""Measure a trained Falcon drafter on the embedded model: acceptance on HumanEval by drafted position, and speed.

``python -m experiments.falcon_eval [--checkpoint PATH] [--problems N] [--decode-prompts M] [--out FILE.json]``

* ``humaneval``: teacher-forced figures at T = 1 on HumanEval *continuations* (prompt + canonical solution; the
  head is never trained on HumanEval) over the solution's tokens, as ``experiments.drafter_eval`` does for the
  feature head: ``token1``/``token2`` = the first head pass (exact target features), ``token3``/``token4`` = the
  second pass fed the head's own features (drafted tokens teacher-forced). ``top1`` = P(argmax q = argmax p),
  ``sum_min`` = mean :math:`\\sum_v \\min(p_v, q_v)` (single-draft acceptance at T = 1).
* ``decoding``: greedy plain decoding, the chain decoder (gamma 4: two head passes) and the tree decoder on
  Falcon's tree (``falcon_tree(2, 2)``, 11 nodes, two head passes) with this drafter, interleaved prompt by
  prompt on the first ``--decode-prompts`` HumanEval prompts and on the project's own code/prose prompts, in
  ``--dtype``: tokens per step tau, acceptance by drafted position, and wall-time ratios plain / decoder
  (speedups; absolute times mean little on a shared CPU).
"""

from __future__ import annotations

import argparse
import json

import torch

from executor.decoders import AutoregressiveDecoder, ChainDecoder, TreeDecoder, falcon_tree
from executor.drafters import FalconDrafter
from executor.drafters.parse import kind_checkpoint
from executor.training.falcon import _forward, coupled_inputs, first_in_block
from executor.training.features import target_logits
from executor.weights import load_model
from experiments.drafter_eval import humaneval_figures


def teacher_forced(target, tokenizer, drafter: FalconDrafter, count: int) -> dict:
    """Tokens 1-4 of Falcon's first two passes over the solution tokens (see the module docstring)."""
    head = drafter.head

    def rows_of(ids, start, hidden):
        length = len(ids)
        inputs, tokens = hidden[:, : length - 2], torch.tensor([ids[1 : length - 1]])
        entries = length - 2  # entry column c predicts token c + 3 (0-based ids) from h_{c+2}
        p = target_logits(target, hidden[0, 2:]).softmax(-1)
        first = first_in_block(entries, 0)
        scored = torch.arange(entries) + 3 >= start  # predicted tokens inside the solution
        g = _forward(head, target, inputs, tokens, 0)
        everything = torch.ones(1, entries, dtype=torch.bool)
        g2 = _forward(head, target, coupled_inputs(inputs, g, everything, 0), tokens, 0)
        later = torch.arange(entries) >= 2
        for name, rows, out in (
            ("token1", first & scored, g),
            ("token2", ~first & scored, g),
            ("token3", first & scored & later, g2),
            ("token4", ~first & scored & later, g2),
        ):
            yield name, p[rows], head.logits(target, out[0][rows]), head.vocab

    return humaneval_figures(target, tokenizer, count, rows_of) | {"problems": count}


def decoding(target, tokenizer, drafter: FalconDrafter, prompts: list[str], new_tokens: int) -> dict:
    decoders = {
        "plain": AutoregressiveDecoder(target),
        "chain": ChainDecoder(target, drafter, gamma=4),
        "tree": TreeDecoder(target, drafter, tree=falcon_tree(2, 2)),
    }
    walls = dict.fromkeys(decoders, 0.0)
    stats = {name: {"steps": 0, "emitted": 0, "accepted": [0, 0, 0, 0]} for name in ("chain", "tree")}
    identical = True
    for text in prompts:
        ids = tokenizer.encode(text)
        outputs = {}
        for name, decoder in decoders.items():  # interleaved: every decoder on this prompt, then the next
            result = decoder.generate(ids, new_tokens)
            walls[name] += result.wall_time
            outputs[name] = result.token_ids
            if name in stats:
                for step in result.steps:
                    stats[name]["steps"] += 1
                    stats[name]["emitted"] += len(step.emitted)
                    for depth, ok in enumerate(step.accepted[:4]):
                        stats[name]["accepted"][depth] += ok
        identical &= outputs["chain"] == outputs["plain"] == outputs["tree"]
    report = {"prompts": len(prompts), "new_tokens": new_tokens, "greedy_identical": identical}
    for name, s in stats.items():
        report[name] = {
            "tau": s["emitted"] / s["steps"],
            "acceptance_by_position": [a / s["steps"] for a in s["accepted"]],
            "speedup_vs_plain": walls["plain"] / walls[name],
        }
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="default: the cached falcon drafter")
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--decode-prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-decoding", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from executor.device import set_threads
    from experiments.prompts import OTHER_PROMPTS, humaneval_prompts

    set_threads(args.threads)
    target, tokenizer = load_model(device="cpu", dtype=getattr(torch, args.dtype))
    path = args.checkpoint or kind_checkpoint(target, "falcon", train_if_missing=False)
    if path is None:
        raise SystemExit(
            "no trained falcon drafter in the cache: run `specbound train-drafter --kind falcon`"
        )
    drafter = FalconDrafter.from_checkpoint(target, path)
    report = {
        "checkpoint": str(path),
        "dtype": args.dtype,
        "held_out_stdlib": {
            "token1": drafter.card["held_out"],
            "token2": drafter.card["held_out_token2"],
            **drafter.card["held_out_pass2"],
        },
        "humaneval": teacher_forced(target, tokenizer, drafter, args.problems),
    }
    print(json.dumps(report, indent=2), flush=True)
    if not args.skip_decoding:
        report["decoding_humaneval"] = decoding(
            target, tokenizer, drafter, humaneval_prompts(args.decode_prompts), args.new_tokens
        )
        print(json.dumps(report["decoding_humaneval"], indent=2), flush=True)
        report["decoding_other"] = decoding(
            target, tokenizer, drafter, list(OTHER_PROMPTS[: args.decode_prompts]), args.new_tokens
        )
        print(json.dumps(report["decoding_other"], indent=2), flush=True)
    if args.out:
        from executor.files import write_bytes

        write_bytes(json.dumps(report, indent=2).encode(), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
