"""``specbound bench``: the one benchmark engine -- tokens per second, tau and acceptance by position of our
decoders against ``transformers`` on the same prompts, in the same run.

A *row* is one decoder in one dtype at one temperature (:class:`RowKey`); a *runner* generates one prompt with
it and returns a :class:`Record` (generated tokens, wall seconds, and for our decoders the step counts behind
tau and the per-position acceptance). The rows themselves are built in :mod:`experiments.bench_rows`.

Interleaved rounds: a round is one prompt (repeated ``rounds`` times); every row runs it once, in turn, the
order rotated by one from round to round, so a change of machine load hits every row alike and no row is
always first. After each round the records are checkpointed (temp file + ``os.replace``); an interrupted run
resumes at the first unfinished round when it is restarted with the same settings.

Summary of a row over all rounds (:func:`summarise`):

* tokens/s = generated tokens / wall time, prefill included, both summed over rounds;
* :math:`\\tau` = emitted tokens / target forward passes (bonus token counted, plain decoding has
  :math:`\\tau = 1`; Leviathan et al., ICML 2023, arXiv 2211.17192, §3.1);
* acceptance by position ``d`` = steps whose accepted path reached depth ``d`` / steps that drafted (vLLM's
  per-position acceptance rate);
* ``vs_ar`` = tokens/s over our plain decoding (``ar``) in the same dtype and at the same temperature -- the
  speedup; ``vs_hf_generate`` the same against ``transformers`` ``generate``, ``vs_llamacpp`` against
  llama.cpp's plain decoding (``llamacpp``);
* ``decode_tokens_per_s`` (rows whose records time their first token: llama.cpp) = tokens after the first
  over the time after the first token (the prefill left out);
* at temperature 0, ``agrees_with_ar``: the fraction of rounds whose generated tokens equal ``ar``'s in the
  same dtype (greedy speculative decoding must reproduce plain greedy decoding, up to near-ties in the
  logits); ``None`` at temperature > 0; and for our decoders ``agrees_with_ar_up_to_ties``, which also counts
  rounds whose first difference is at a tie of the target's logits or one rounding step
  (:mod:`experiments.divergence`): below 1, a decoder is not reproducing its target.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from executor.files import write_json, write_text

__all__ = [
    "Record",
    "RowKey",
    "checkpoint_path",
    "greedy_divergences",
    "read_checkpoint",
    "render_markdown",
    "run_bench",
    "save_checkpoint",
    "summarise",
    "write_report",
]


@dataclass(frozen=True, order=True)
class RowKey:
    """One row: decoder name (e.g. ``"chain-feature"``), dtype name and sampling temperature."""

    decoder: str
    dtype: str
    temperature: float

    @property
    def label(self) -> str:
        return f"{self.decoder}@{self.dtype}@T{self.temperature:g}"


@dataclass
class Record:
    """One runner call. ``steps``/``emitted``/``reached``/``drafting`` are ``None`` for peers (transformers,
    llama.cpp): ``reached[d]`` counts steps whose accepted path reached depth ``d + 1``, ``drafting`` the steps
    that drafted. ``token_ids`` (our decoders and peers alike) lets greedy rows be compared with ``ar``.
    ``first_token_seconds`` (llama.cpp rows): the time to the first token, i.e. the prefill."""

    tokens: int
    seconds: float
    steps: int | None = None
    emitted: int | None = None
    reached: list[int] | None = None
    drafting: int | None = None
    token_ids: list[int] = field(default_factory=list)
    first_token_seconds: float | None = None

    @classmethod
    def from_generation(cls, result) -> Record:
        """From an :class:`executor.logs.GenerationResult`."""
        drafting = [s for s in result.steps if s.n_drafted > 0]
        depth = max((len(s.accepted) for s in drafting), default=0)
        reached = [0] * depth
        for step in drafting:
            for d, ok in enumerate(step.accepted):
                reached[d] += int(bool(ok))
        return cls(
            tokens=result.n_tokens,
            seconds=result.wall_time,
            steps=len(result.steps),
            emitted=sum(len(s.emitted) for s in result.steps),
            reached=reached,
            drafting=len(drafting),
            token_ids=list(result.token_ids),
        )


#: ``runner(prompt_ids, max_new_tokens, seed) -> Record``
Runner = Callable[[list[int], int, int], Record]


def run_bench(
    runners: dict[RowKey, Runner],
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    rounds: int = 1,
    seed: int = 0,
    checkpoint: str | None = None,
    fingerprint: dict | None = None,
    prepared: dict | None = None,
    progress=None,
    after_round=None,
) -> list[dict[RowKey, Record]]:
    """Run every row on every prompt, ``rounds`` times, interleaved and rotated; one dict of records per round.

    Round ``r`` runs prompt ``r % len(prompts)`` with seed ``seed + r`` (the sampling seed of every row, so
    that at temperature > 0 all rows of a round see the same random stream where they draw alike). Each row
    first generates 4 tokens from the first prompt, untimed (allocations, lazy initialisation).

    With ``checkpoint`` (a path), the finished rounds are saved there after each round together with
    ``fingerprint`` and ``prepared`` (what the rows were built from, e.g. the planned trees: see
    :func:`read_checkpoint`); a run whose checkpoint has the same fingerprint and rows skips them (resume).
    ``progress`` wraps an iterable of ``(round, row)`` pairs (e.g. a tqdm bar). ``after_round(index)``, if
    given, runs after every finished round and before its checkpoint, so what it adds to ``prepared`` (e.g. a
    peer's costs measured between the rounds) is saved and resumed with the rounds.
    """
    if not runners or not prompts:
        raise ValueError("runners and prompts must be non-empty")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    keys = list(runners)
    saved = read_checkpoint(checkpoint, fingerprint) if checkpoint else None
    done = _rounds(saved, keys)
    total = rounds * len(prompts)
    if len(done) < total:
        for key in keys:
            runners[key](prompts[0], min(4, max_new_tokens), seed)
    pairs = [(r, key) for r in range(len(done), total) for key in _rotated(keys, r)]
    iterator = progress(pairs) if progress else pairs
    current: dict[RowKey, Record] = {}
    for index, key in iterator:
        current[key] = runners[key](prompts[index % len(prompts)], max_new_tokens, seed + index)
        if len(current) == len(keys):
            done.append({key: current[key] for key in keys})
            current = {}
            if after_round is not None:
                after_round(index)
            if checkpoint:
                save_checkpoint(checkpoint, fingerprint, prepared, done)
    return done


def _rotated(keys: list, index: int) -> list:
    shift = index % len(keys)
    return keys[shift:] + keys[:shift]


def save_checkpoint(path: str, fingerprint, prepared, done: list[dict[RowKey, Record]]) -> None:
    """Write the checkpoint (atomically): fingerprint, prepared data and the finished rounds."""
    rounds = [[{"row": asdict(k), "record": asdict(r)} for k, r in rnd.items()] for rnd in done]
    write_json({"fingerprint": fingerprint, "prepared": prepared, "rounds": rounds}, path)


def read_checkpoint(path: str, fingerprint) -> dict | None:
    """The checkpoint at ``path`` if it was written with the same ``fingerprint``, else ``None``."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as stream:
            data = json.load(stream)
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("fingerprint") != json.loads(json.dumps(fingerprint)):
        return None
    return data


def _rounds(saved: dict | None, keys: list[RowKey]) -> list[dict[RowKey, Record]]:
    """The finished rounds of a checkpoint, if it ran exactly these rows; else ``[]``."""
    done = []
    for rnd in (saved or {}).get("rounds", []):
        records = {RowKey(**item["row"]): Record(**item["record"]) for item in rnd}
        if set(records) != set(keys):
            return []
        done.append({key: records[key] for key in keys})
    return done


def checkpoint_path(out: str) -> str:
    """Where the run writing ``out`` keeps its checkpoint (removed once the report is written)."""
    return os.path.splitext(out)[0] + ".partial.json"


def greedy_divergences(
    done: list[dict[RowKey, Record]], prompts: list[list[int]], models: dict, rows
) -> dict[tuple[int, RowKey], dict]:
    """For every round and every greedy row in ``rows`` (decoders that verify with ``models[dtype]``, the
    target ``ar`` runs), keyed by ``(round, row)``: ``None`` where its tokens equal ``ar``'s, else
    :func:`experiments.divergence.first_divergence`. Round ``r`` ran prompt ``r % len(prompts)``
    (:func:`run_bench`)."""
    from experiments.divergence import first_divergence

    found = {}
    for index, round_records in enumerate(done):
        prompt = prompts[index % len(prompts)]
        for key, record in round_records.items():
            ar = RowKey("ar", key.dtype, key.temperature)
            if key.temperature != 0 or key == ar or key not in rows or ar not in round_records:
                continue
            reference = round_records[ar].token_ids
            found[(index, key)] = (
                None
                if record.token_ids == reference
                else first_divergence(models[key.dtype], prompt, reference, record.token_ids)
            )
    return found


def summarise(done: list[dict[RowKey, Record]], divergences: dict | None = None) -> list[dict]:
    """One summary row per :class:`RowKey` (see the module docstring), in the order the rows were given.

    With ``divergences`` (:func:`greedy_divergences`), greedy rows also get ``agrees_with_ar_up_to_ties``: the
    fraction of rounds whose tokens equal ``ar``'s or first differ where the target's two logits are tied or one
    rounding step apart, and ``divergences``, those first differences."""
    if not done:
        raise ValueError("done must hold at least one finished round")
    keys = list(done[0])
    divergences = divergences or {}
    totals = {}
    for key in keys:
        records = [rnd[key] for rnd in done]
        tokens = sum(r.tokens for r in records)
        seconds = sum(r.seconds for r in records)
        row = {
            **asdict(key),
            "rounds": len(records),
            "tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else float("nan"),
            "tau": None,
            "acceptance_per_position": None,
            "decode_tokens_per_s": None,
        }
        if all(r.first_token_seconds is not None and r.tokens > 1 for r in records):
            decode = sum(r.seconds - r.first_token_seconds for r in records)
            row["decode_tokens_per_s"] = (tokens - len(records)) / decode if decode > 0 else float("nan")
        if all(r.steps is not None for r in records):
            steps = sum(r.steps for r in records)
            drafting = sum(r.drafting for r in records)
            depth = max(len(r.reached) for r in records)
            reached = [sum(r.reached[d] for r in records if d < len(r.reached)) for d in range(depth)]
            row["tau"] = sum(r.emitted for r in records) / steps if steps else float("nan")
            row["acceptance_per_position"] = [count / drafting for count in reached] if drafting else []
        totals[key] = row
    for key, row in totals.items():
        for name, baseline in (
            ("vs_ar", "ar"),
            ("vs_hf_generate", "hf-generate"),
            ("vs_llamacpp", "llamacpp"),
        ):
            base = totals.get(RowKey(baseline, key.dtype, key.temperature))
            row[name] = row["tokens_per_s"] / base["tokens_per_s"] if base else None
        ar = RowKey("ar", key.dtype, key.temperature)
        if key.temperature == 0 and ar in totals:
            same = [rnd[key].token_ids == rnd[ar].token_ids for rnd in done]
            row["agrees_with_ar"] = sum(same) / len(same)
        else:
            row["agrees_with_ar"] = None
        checked = [divergences.get((i, key)) for i in range(len(done))]
        if row["agrees_with_ar"] is not None and any((i, key) in divergences for i in range(len(done))):
            up_to_ties = [
                s or bool(d and d.get("within_one_step")) for s, d in zip(same, checked, strict=True)
            ]
            row["agrees_with_ar_up_to_ties"] = sum(up_to_ties) / len(up_to_ties)
            row["divergences"] = [d for d in checked if d]
        else:
            row["agrees_with_ar_up_to_ties"] = None
    return list(totals.values())


def _number(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}"


def _positions(values, shown: int = 4) -> str:
    if values is None:
        return "–"
    if not values:
        return "(no drafts)"
    text = " ".join(f"{v:.2f}" for v in values[:shown])
    return text + (" …" if len(values) > shown else "")


def render_markdown(result: dict) -> str:
    """The report: settings, the rows per temperature, the forward costs per dtype and the planned trees."""
    settings = result["settings"]
    lines = [
        "# specbound bench: our decoders against transformers",
        "",
        f"{settings['prompt_set']} prompts: {settings['prompts']}, {settings['rounds']} round(s) each, "
        f"{settings['max_new_tokens']} new tokens, {settings['threads']} threads, torch {settings['torch']}. "
        "Rows interleaved per round (order rotated); speedup `vs ar` = tokens/s over our plain decoding in the "
        "same dtype at the same temperature; `vs hf` over transformers `generate`, same dtype and temperature.",
    ]
    if result.get("compile_seconds"):  # --compile: our targets ran compiled; compile time is not in any row
        spent = ", ".join(
            f"{name} {'eager (fallback)' if s is None else f'{s:.1f} s'}"
            for name, s in result["compile_seconds"].items()
        )
        lines += ["", f"Our targets compiled (`--compile`; compile time, not in the rows): {spent}."]
    for temperature in sorted({row["temperature"] for row in result["rows"]}):
        lines += [
            "",
            f"## Temperature {temperature:g}",
            "",
            "| decoder | dtype | tokens/s | τ | acceptance by position | vs ar | vs hf | same tokens as ar "
            "| same up to ties |",
            "|---|---|---:|---:|---|---:|---:|---:|---:|",
        ]
        for row in result["rows"]:
            if row["temperature"] != temperature:
                continue
            lines.append(
                f"| {row['decoder']} | {row['dtype']} | {row['tokens_per_s']:.2f} | {_number(row['tau'])} "
                f"| {_positions(row['acceptance_per_position'])} | {_number(row['vs_ar'])} "
                f"| {_number(row['vs_hf_generate'])} | {_number(row['agrees_with_ar'])} "
                f"| {_number(row.get('agrees_with_ar_up_to_ties'))} |"
            )
    forward = result.get("forward") or []
    if forward:
        dtypes = list(forward[0]["median_ms"])
        lines += [
            "",
            "## Target forward time per number of new tokens (medians, dtypes interleaved)",
            "",
            "| n | "
            + " | ".join(f"{d} ms" for d in dtypes)
            + (" | bfloat16 / float32 |" if len(dtypes) > 1 else " |"),
            "|---:|" + "---:|" * (len(dtypes) + (len(dtypes) > 1)),
        ]
        for row in forward:
            cells = " | ".join(f"{row['median_ms'][d]:.2f}" for d in dtypes)
            ratio = row.get("bfloat16_over_float32")
            lines.append(f"| {row['n']} | {cells} |" + (f" {_number(ratio)} |" if len(dtypes) > 1 else ""))
    if result.get("llamacpp"):
        from experiments.bench_llamacpp import render_markdown as render_llamacpp

        lines += render_llamacpp(result["llamacpp"])
    plans = result.get("plans") or []
    if plans:
        lines += [
            "",
            "## Trees planned by plan-tree (profile latencies, measured acceptance per child rank)",
            "",
            "| drafter | dtype | T | acceptance per rank | draft/target cost | size | depth | predicted speedup |",
            "|---|---|---:|---|---:|---:|---:|---:|",
        ]
        for plan in plans:
            lines.append(
                f"| {plan['drafter']} | {plan['dtype']} | {plan['temperature']:g} "
                f"| {_positions(plan['acceptance'], 8)} | {plan['cost_ratio']:.3f} | {plan['size']} "
                f"| {plan['depth']} | {plan['speedup']:.3f} |"
            )
        lines += ["", "Each plan reproduces with `specbound plan-tree` on the files the run wrote:", ""]
        lines += [f"    {plan['command']}" for plan in plans]
    return "\n".join(lines) + "\n"


def write_report(result: dict, out: str) -> str:
    """Write ``out`` (JSON) and the Markdown next to it (``.md``), both atomically; returns the Markdown."""
    write_json(result, out)
    markdown = render_markdown(result)
    write_text(markdown, os.path.splitext(out)[0] + ".md")
    checkpoint = checkpoint_path(out)
    if os.path.exists(checkpoint):
        os.remove(checkpoint)
    return markdown
