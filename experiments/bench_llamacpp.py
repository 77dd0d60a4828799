"""``specbound bench --peer llamacpp``: llama.cpp's own costs, our prompt-lookup acceptance, and the prediction.

Before the timed rounds (:func:`prepare`):

* **llama.cpp's t(n)** on each weight format, interleaved over the formats
  (:func:`experiments.peer_llamacpp.profile_llamacpp`, on the models that run prompt lookup, i.e. with logits
  for every position), for every ``n`` from 1 to ``max(K) + 1`` and the powers of two up to 16; written as
  ``specbound profile`` documents ``OUT.latency-llamacpp-W.json`` (``plan-length --latency`` reads them).
* **Our prompt-lookup drafter's steps**: our chain decoder with
  :class:`executor.drafters.PromptLookupDrafter` (``max_ngram=2``, llama-cpp-python's rule) and ``K`` draft
  tokens decodes every bench prompt greedily in float32, untimed; per prompt, each step's (drafted,
  accepted) counts (``OUT.lookup-steps-kK.json``), and the pooled acceptance by position
  (``OUT.acceptance-lookup-kK.json``, for ``specbound plan-length --acceptance``: its fixed-K rule assumes
  every step drafts K tokens, an upper estimate when lookups find shorter or no matches). After the rounds the
  steps come from the text llama.cpp's prompt lookup produced instead (:func:`text_steps` on
  :func:`own_texts`): its BF16 and Q4_1 texts are not ours, and lookup's batched passes may leave its own
  plain greedy path.

Between the rounds (:func:`profile_between_rounds`, after every round: one warm-up and two timed passes per size
and format, pooled over the run into ``OUT.latency-llamacpp-W-during.json``) and after them
(:func:`profile_after`, ``OUT.latency-llamacpp-W-after.json``), llama.cpp's t(n) is measured again: profiles
taken only before the rounds drifted from the rows by 15-49% at n >= 2 on two machines (docs/bench.md), in
either direction, while the rows themselves are interleaved; the profile between the rounds samples the
machine as the rows found it. Then (:func:`predictions`), for every weight format and ``K``, the
speedup of llama.cpp's prompt lookup over its plain decoding predicted by
:func:`experiments.peer_predict.held_out_prediction` -- each prompt from the acceptance on the *other* prompts
(leave one out), charged llama.cpp's ``t(k + 1)`` (the medians between the rounds; without them, the mean of
the medians before and after), its lookup time per step and its sampling time per token -- against the
measured ratio of decoding speeds
(tokens after the first over the time after the first token: the prefill, paid once by both, is left out;
the ratio with the prefill is the table's ``vs llamacpp``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "own_texts",
    "predictions",
    "prepare",
    "profile_after",
    "profile_between_rounds",
    "render_markdown",
    "section",
    "text_steps",
    "write_profiles_during",
]

#: Timed passes per size and weight format in each profile between two rounds (after one warm-up pass).
REPEATS_BETWEEN_ROUNDS = 2


#: Our plain-decoding rows of the section (float32 activations): float, int8 and Q4_1 weights, and with
#: ``--compile`` their eager twins (the unsuffixed rows then run compiled).
OUR_PLAIN_ROWS = tuple(f"ar{w}{e}" for w in ("", "-int8", "-q4_1") for e in ("", "-eager"))


def profile_sizes(lookups) -> list[int]:
    """Every size a step of prompt lookup can verify (``1 .. max(K) + 1``) and the powers of two to 16."""
    return sorted(set(range(1, max(lookups) + 2)) | {1, 2, 4, 8, 16})


def lookup_steps(model, prompts: list[list[int]], lookup: int, max_new_tokens: int) -> list[list[list[int]]]:
    """Per prompt, ``[drafted, accepted]`` of every step of our greedy chain decoder with prompt lookup."""
    import torch

    from executor.decoders import ChainDecoder, Sampling
    from executor.drafters import PromptLookupDrafter
    from experiments.peer_llamacpp import LOOKUP_NGRAM
    from experiments.peer_predict import steps_of

    drafter = PromptLookupDrafter(max_ngram=LOOKUP_NGRAM, max_tokens=lookup)
    decoder = ChainDecoder(model, drafter, gamma=lookup, sampling=Sampling(temperature=0.0))
    return [
        [list(s) for s in steps_of(decoder.generate(p, max_new_tokens, generator=torch.Generator()))]
        for p in prompts
    ]


def text_steps(prompt: list[int], text: list[int], lookup: int) -> list[list[int]]:
    """``[drafted, accepted]`` of every step prompt lookup (``max_ngram=2``, ``lookup`` tokens) takes to produce
    ``text`` after ``prompt`` under greedy verification, where a drafted token is accepted exactly when it is
    the text's next token: the steps a greedy decoder whose text is ``text`` takes, computed from the text
    alone (on our own greedy text they are :func:`lookup_steps`', tested)."""
    from executor.drafters import PromptLookupDrafter
    from experiments.peer_llamacpp import LOOKUP_NGRAM

    drafter = PromptLookupDrafter(max_ngram=LOOKUP_NGRAM, max_tokens=lookup)
    context, position, steps = list(prompt), 0, []
    while position < len(text):
        proposal = drafter.propose(context)
        accepted = 0
        while (
            accepted < len(proposal)
            and position + accepted < len(text)
            and proposal[accepted] == text[position + accepted]
        ):
            accepted += 1
        steps.append([len(proposal), accepted])
        emitted = text[position : position + accepted + 1]
        context += emitted
        position += len(emitted)
    return steps


def own_texts(done: list[dict], prompts: list[list[int]], weights, lookups) -> dict:
    """``{(weights, K): [(prompt, text), ...]}``: the greedy text llama.cpp's prompt lookup with ``K`` draft tokens
    produced for every prompt (its ``llamacpp-lookup-kK`` row, in the first round that ran the prompt), for the
    weight formats and ``K`` that ran on every prompt.

    Its own text, not its plain decoding's: in BF16 a pass over several tokens rounds differently from a
    one-token pass, so lookup decoding can leave the plain greedy path (measured: 1 of 5 prompts, after 19
    tokens, into a repetitive one that took 72 steps where the plain text takes 106).
    """
    from experiments.bench import RowKey
    from experiments.bench_rows import LLAMACPP_DTYPES

    out = {}
    for name in weights:
        for lookup in lookups:
            key = RowKey(f"llamacpp-lookup-k{lookup}", LLAMACPP_DTYPES[name], 0.0)
            texts = {}
            for index, round_records in enumerate(done):
                if key in round_records:
                    texts.setdefault(index % len(prompts), round_records[key].token_ids)
            if len(texts) == len(prompts):
                out[(name, int(lookup))] = [(prompts[i], texts[i]) for i in range(len(prompts))]
    return out


def prepare(config, llms: dict, model, prompts, context, max_new_tokens: int, stem: str) -> dict:
    """Profiles and steps (module docstring); ``llms[weights]`` a Llama with logits for every position,
    ``model`` our float32 target. Returns the ``prepared["llamacpp"]`` part of the bench checkpoint."""
    from tqdm import tqdm

    from executor.files import write_json
    from experiments.peer_predict import lookup_model

    profiles, measured = _profile(config, llms, context, stem, "")
    steps = {}
    for lookup in tqdm(config.lookups, desc="our prompt-lookup steps", unit="K"):
        steps[str(lookup)] = lookup_steps(model, prompts, lookup, max_new_tokens)
        write_json({"lookup": lookup, "steps": steps[str(lookup)]}, f"{stem}.lookup-steps-k{lookup}.json")
        pooled = lookup_model([s for prompt in steps[str(lookup)] for s in prompt], lookup)
        write_json({"per_position": pooled.alpha.tolist()}, f"{stem}.acceptance-lookup-k{lookup}.json")
    return {"profiles": profiles, "documents": measured, "steps": steps}


def profile_after(config, llms: dict, context, stem: str) -> dict:
    """llama.cpp's t(n) measured again after the rounds, as :func:`prepare` measured it before them; the
    ``prepared["llamacpp"]`` keys ``profiles_after`` (paths) and ``documents_after``."""
    profiles, measured = _profile(config, llms, context, stem, "-after")
    return {"profiles_after": profiles, "documents_after": measured}


def profile_between_rounds(config, llms: dict, context, part: dict):
    """``after_round(index)`` for :func:`experiments.bench.run_bench`: a short profile of llama.cpp's t(n)
    (one warm-up and :data:`REPEATS_BETWEEN_ROUNDS` timed passes), its samples pooled in
    ``part["samples_during"]`` and the summaries of all of them in ``part["documents_during"]`` (``part`` is
    ``prepared["llamacpp"]``, checkpointed with the rounds)."""
    from experiments.peer_llamacpp import profile_llamacpp

    def after_round(index: int) -> None:
        part["documents_during"] = profile_llamacpp(
            llms,
            context,
            sizes=profile_sizes(config.lookups),
            repeats=REPEATS_BETWEEN_ROUNDS,
            warmup=1,
            samples=part.setdefault("samples_during", {}),
        )

    return after_round


def write_profiles_during(part: dict, stem: str) -> dict:
    """Write the pooled profiles between the rounds (``OUT.latency-llamacpp-W-during.json``); returns the
    ``prepared["llamacpp"]`` key ``profiles_during`` (paths), empty when none was taken."""
    documents = part.get("documents_during") or {}
    return {"profiles_during": {w: _write_profile(d, stem, w, "-during") for w, d in documents.items()}}


def _write_profile(part: dict, stem: str, weights: str, suffix: str) -> str:
    from executor.files import write_json
    from experiments.profiling import PROFILE_FORMAT, PROFILE_VERSION

    document = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "model": "embedded SmolLM2-135M-Instruct (llama.cpp)",
        "dtype": weights,
        "device": "cpu",
        "source": "specbound bench --peer llamacpp: llama.cpp Llama.eval, weights interleaved",
        **part,
    }
    path = f"{stem}.latency-llamacpp-{weights}{suffix}.json"
    write_json(document, path)
    return path


def _profile(config, llms: dict, context, stem: str, suffix: str) -> tuple[dict, dict]:
    from experiments.peer_llamacpp import profile_llamacpp

    measured = profile_llamacpp(
        llms,
        context,
        sizes=profile_sizes(config.lookups),
        repeats=config.latency_repeats,
        warmup=1,
        progress=True,
    )
    profiles = {weights: _write_profile(part, stem, weights, suffix) for weights, part in measured.items()}
    return profiles, measured


class Costs(NamedTuple):
    """llama.cpp's costs from one profile: t(n) by n, lookup seconds per step, sampling seconds per token."""

    times: dict
    lookup_time: float
    token_time: float

    @classmethod
    def of(cls, document: dict) -> Costs:
        from experiments.profiling import profile_target_times

        times = profile_target_times({"format": "specbound-profile", "version": 1, **document})
        return cls(times, document["drafter"]["draft_time"], document["sample_time"]["median"])

    def mean(self, other: Costs) -> Costs:
        """The mean of two profiles' medians, on the sizes both measured."""
        times = {n: (t + other.times[n]) / 2 for n, t in self.times.items() if n in other.times}
        return Costs(
            times, (self.lookup_time + other.lookup_time) / 2, (self.token_time + other.token_time) / 2
        )

    def ratio(self, n: int) -> float:
        return self.times[n] / self.times[1]


def predictions(
    prepared: dict, rows: list[dict], max_new_tokens: int, texts: dict | None = None
) -> list[dict]:
    """Predicted against measured speedup of llama.cpp's prompt lookup, per weight format and ``K``.

    The acceptance comes from the text llama.cpp's prompt lookup produced where ``texts`` (see :func:`own_texts`)
    has it (:func:`text_steps`; each prompt still predicted from the *other* prompts), else from our float32
    decoding's steps.
    """
    from experiments.bench_rows import LLAMACPP_DTYPES
    from experiments.peer_predict import held_out_prediction

    by_key = {(row["decoder"], row["dtype"]): row for row in rows if row["temperature"] == 0}
    out = []
    for weights, document in prepared["documents"].items():
        before = Costs.of(document)
        after = prepared.get("documents_after", {}).get(weights)
        after = None if after is None else Costs.of(after)
        during = (prepared.get("documents_during") or {}).get(weights)
        during = None if during is None else Costs.of(during)
        costs = during or (before if after is None else before.mean(after))
        dtype = LLAMACPP_DTYPES[weights]
        plain = by_key.get(("llamacpp", dtype))
        for lookup, steps in prepared["steps"].items():
            source = "our float32 text"
            if texts and (weights, int(lookup)) in texts:
                steps = [
                    text_steps(prompt, text, int(lookup)) for prompt, text in texts[(weights, int(lookup))]
                ]
                source = "llama.cpp's own text"
            lookup_row = by_key.get((f"llamacpp-lookup-k{lookup}", dtype))
            predicted = held_out_prediction(
                costs.times,
                steps,
                [max_new_tokens - 1] * len(steps),
                int(lookup),
                lookup_time=costs.lookup_time,
                token_time=costs.token_time,
            )
            measured = measured_total = None
            if plain and lookup_row and plain["decode_tokens_per_s"] and lookup_row["decode_tokens_per_s"]:
                measured = lookup_row["decode_tokens_per_s"] / plain["decode_tokens_per_s"]
                measured_total = lookup_row["tokens_per_s"] / plain["tokens_per_s"]
            out.append(
                {
                    "weights": weights,
                    "lookup": int(lookup),
                    "t_ratio": costs.ratio(int(lookup) + 1),
                    "t_ratio_before": before.ratio(int(lookup) + 1),
                    "t_ratio_after": None if after is None else after.ratio(int(lookup) + 1),
                    "t_ratio_during": None if during is None else during.ratio(int(lookup) + 1),
                    "costs": "between the rounds" if during else "mean of before and after",
                    "acceptance_from": source,
                    "tokens_per_step": float(
                        np.mean([1 + a for s in steps for _, a in s]) if any(steps) else 1.0
                    ),
                    "predicted": predicted["speedup"],
                    "measured_decode": measured,
                    "measured_total": measured_total,
                    "error": None if measured is None else predicted["speedup"] / measured - 1,
                    "latency": prepared["profiles"][weights],
                    "latency_after": prepared.get("profiles_after", {}).get(weights),
                    "latency_during": prepared.get("profiles_during", {}).get(weights),
                    "model": predicted["model"],
                }
            )
    return out


def _ratios(prediction: dict) -> str:
    """t(K+1)/t(1) as the prediction used it, and before / after the rounds when both were measured."""
    if prediction.get("t_ratio_after") is None:
        return f"{prediction['t_ratio']:.2f}"
    return f"{prediction['t_ratio']:.2f} ({prediction['t_ratio_before']:.2f} / {prediction['t_ratio_after']:.2f})"


def _latency(prediction: dict) -> str:
    """The profile the prediction charged: the one between the rounds when there is one."""
    return prediction.get("latency_during") or prediction["latency"]


def render_markdown(section: dict) -> list[str]:
    """The report's llama.cpp section: our float32/int8 against llama.cpp, and predicted against measured."""
    lines = [
        "",
        "## llama.cpp on the same weights (greedy)",
        "",
        "| row | weights | tokens/s | decoding tokens/s | vs our float32 ar | vs our int8 ar | vs our q4_1 ar "
        "| vs llamacpp |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in section["rows"]:
        cells = [
            row["decoder"],
            row["dtype"],
            f"{row['tokens_per_s']:.2f}",
            "–" if row.get("decode_tokens_per_s") is None else f"{row['decode_tokens_per_s']:.2f}",
            *(
                "–" if row.get(k) is None else f"{row[k]:.2f}"
                for k in ("vs_f32", "vs_int8", "vs_q4_1", "vs_llamacpp")
            ),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "### Prompt lookup: predicted from llama.cpp's t(n) and the acceptance on the other prompts",
        "",
        "| weights | K | t(K+1)/t(1) charged (before / after the rounds) | acceptance of | τ (all prompts) "
        "| predicted | measured (decoding) | error | measured (with prefill) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for p in section["predictions"]:

        def number(value, fmt="{:.2f}"):
            return "–" if value is None else fmt.format(value)

        lines.append(
            f"| {p['weights']} | {p['lookup']} | {_ratios(p)} | {p.get('acceptance_from', 'our float32 text')} "
            f"| {p['tokens_per_step']:.2f} "
            f"| {p['predicted']:.3f} | {number(p['measured_decode'], '{:.3f}')} "
            f"| {number(p['error'], '{:+.1%}')} | {number(p['measured_total'], '{:.3f}')} |"
        )
    charged = sorted({p.get("costs", "mean of before and after") for p in section["predictions"]})
    if charged:
        lines += ["", f"t(n) charged: {', '.join(charged)} (medians)."]
    lines += [
        "",
        "llama.cpp's t(n) and our acceptance by position, for `specbound plan-length` (its fixed-K rules assume "
        "every step drafts K tokens; the prediction above weighs the drafted lengths observed):",
        "",
    ]
    lines += [
        f"    specbound plan-length --latency {_latency(p)} "
        f"--acceptance {p['latency'].split('.latency-')[0]}.acceptance-lookup-k{p['lookup']}.json"
        for p in section["predictions"]
    ]
    return lines


def section(result_rows: list[dict], prepared: dict, max_new_tokens: int, texts: dict | None = None) -> dict:
    """``result["llamacpp"]``: the llama.cpp rows and our plain-decoding rows (:data:`OUR_PLAIN_ROWS`) with
    their ratios to our float32, int8 and q4_1 ``ar``, and the predictions (``texts``: :func:`predictions`)."""
    ours = {
        row["decoder"]: row for row in result_rows if row["dtype"] == "float32" and row["temperature"] == 0
    }
    rows = []
    for row in result_rows:
        if not row["decoder"].startswith("llamacpp") and row["decoder"] not in OUR_PLAIN_ROWS:
            continue
        if row["temperature"] != 0:
            continue
        entry = dict(row)
        for name, base in (("vs_f32", "ar"), ("vs_int8", "ar-int8"), ("vs_q4_1", "ar-q4_1")):
            entry[name] = row["tokens_per_s"] / ours[base]["tokens_per_s"] if base in ours else None
        rows.append(entry)
    return {"rows": rows, "predictions": predictions(prepared, result_rows, max_new_tokens, texts)}
