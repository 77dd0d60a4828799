"""Bounds over one log shard (full or top-k), streamed in row chunks, and their exact aggregation.

:func:`bound_shard` turns one shard into a small JSON-ready summary: per quantity (the overlap, alpha* for
each draft law and ``n``, each verifier's acceptance) the sums of the per-position ``low`` and ``high`` values
(equal for full logs), fixed-bin histograms of both, and the same sums grouped by position features (target
entropy, temperature). :func:`aggregate` merges summaries in the order given (sorted shard names), so the result
does not depend on which worker finished first: a cluster run equals a single-process run exactly.
"""

from __future__ import annotations

import math

import numpy as np

from experiments.allocator import retained_heap
from experiments.logformat import CHUNK_BYTES, LogError, LogShard, entropy

DRAFTS = ("iid", "wor")
VERIFIERS = ("nss", "naive", "rrs", "rrs_wor", "kseq", "spechub", "greedy", "optimal")
VERIFIER_LAW = {name: "iid" for name in VERIFIERS} | {
    "rrs_wor": "wor",
    "spechub": "spechub",
    "greedy": "greedy",
}
HIST_BINS = 100
#: Bins of the per-feature histograms (coarser: one per quantity, feature bin and end of the interval).
GROUP_HIST_BINS = 20
ENTROPY_EDGES = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, math.inf)
#: Tolerated deviation of a full log's row sum from 1 (float32 rows); beyond it the shard is rejected.
FULL_SUM_TOLERANCE = 1e-3
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
#: Rows of a top-k chunk bounded together (:func:`_blocks`).
TOPK_BLOCK_ROWS = 1024


def quantity_names(ns, drafts=DRAFTS, verifiers=VERIFIERS) -> list[tuple[str, int]]:
    """The (quantity, n) pairs a summary holds: the overlap once, then alpha* and verifiers per ``n``."""
    names = [("overlap", 1)]
    for n in ns:
        names += [(draft, n) for draft in drafts]
        names += [(name, n) for name in verifiers if not (name == "spechub" and n != 2)]
    return names


def _entropy_label(values: np.ndarray) -> np.ndarray:
    index = np.searchsorted(ENTROPY_EDGES, values, side="right") - 1
    return np.clip(index, 0, len(ENTROPY_EDGES) - 2)


def entropy_bins() -> list[str]:
    return [f"[{lo:g}, {hi:g})" for lo, hi in zip(ENTROPY_EDGES[:-1], ENTROPY_EDGES[1:], strict=True)]


def _bins(values, count: int) -> np.ndarray:
    """Bin index of values in [0, 1] on ``count`` equal bins (1 goes in the last)."""
    return np.clip((np.asarray(values) * count).astype(np.int64), 0, count - 1)


def _full_values(p, q, names, vocab):
    """Exact per-row values of every quantity on full rows: ``{(name, n): values or None (not applicable)}``."""
    from theory import optimal_acceptance, verifier
    from theory.draft_laws import acceptance_by_draft_count

    out = {}
    for name, n in names:
        if name == "overlap":
            out[name, n] = np.minimum(p, q).sum(axis=-1)
        elif name in DRAFTS:
            out[name, n] = acceptance_by_draft_count(
                p, q, n, name, lambda p, q, k, law=name: optimal_acceptance(p, q, k, draft=law)
            )
        elif name == "optimal":
            out[name, n] = out.get(("iid", n), np.atleast_1d(optimal_acceptance(p, q, n)))
        else:
            v = verifier(name)
            limit = v.max_exact_vocab(n)
            out[name, n] = (
                None
                if limit is not None and vocab > limit
                else acceptance_by_draft_count(p, q, n, v.draft, v.acceptance)
            )
    return out


def _topk_values(chunk, vocab, names, wor_low: str = "dust"):
    """Per-row intervals of every quantity on a top-k chunk: ``{(name, n): Interval}``."""
    from theory.truncated import top_k_positions, truncated_interval, verifier_acceptance_interval

    with np.errstate(over="ignore"):
        p_values = np.exp(chunk["p_logprobs"].astype(np.float64))
        q_values = np.exp(chunk["q_logprobs"].astype(np.float64))
    positions = top_k_positions(
        chunk["p_ids"].astype(np.int64),
        np.where(chunk["p_ids"] >= 0, p_values, 0.0),
        chunk["q_ids"].astype(np.int64),
        np.where(chunk["q_ids"] >= 0, q_values, 0.0),
        vocab,
        p_rest=chunk.get("p_rest"),
        q_rest=chunk.get("q_rest"),
    )
    out, known = {}, {}
    for name, n in names:
        cache = known.setdefault(n, {})
        if name in ("overlap", *DRAFTS):
            options = {"wor_low": wor_low} if name == "wor" else {}
            cache[name] = out[name, n] = truncated_interval(positions, name, n, **options)
        else:
            out[name, n] = verifier_acceptance_interval(positions, name, n, known=cache)
    logged_entropy = entropy(np.where(chunk["p_ids"] >= 0, p_values, 0.0))
    return out, positions, logged_entropy


def _check_full(p, q, start):
    for name, rows in (("p", p), ("q", q)):
        if not np.all(np.isfinite(rows)):
            raise LogError(f"{name} has NaN or infinite entries (rows from {start})")
        if np.any(rows < 0):
            raise LogError(f"{name} has negative entries (rows from {start})")
        sums = rows.sum(axis=-1)
        if np.any(np.abs(sums - 1.0) > FULL_SUM_TOLERANCE):
            row = int(np.argmax(np.abs(sums - 1.0)))
            raise LogError(f"{name} row {start + row} sums to {sums[row]:.6g}, not 1")
    return p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)


class _Summary:
    """Running sums, histograms and feature groups of one shard."""

    def __init__(self, names):
        self.names = names
        self.positions = 0
        self.exact = {key: 0 for key in names}
        self.sums = {key: [0.0, 0.0] for key in names}
        self.hist = {key: np.zeros((2, HIST_BINS), dtype=np.int64) for key in names}
        self.missing = set()
        self.groups: dict[str, dict] = {}

    def add(self, values: dict, entropy_values, temperature):
        rows = len(entropy_values)
        self.positions += rows
        labels = {f"entropy {entropy_bins()[i]}": _entropy_label(entropy_values) == i for i in range(6)}
        for t in np.unique(temperature):
            labels[f"temperature {t:g}" if np.isfinite(t) else "temperature unknown"] = (
                temperature == t if np.isfinite(t) else ~np.isfinite(temperature)
            )
        for key in self.names:
            value = values[key]
            if value is None:
                self.missing.add(key)
                continue
            low, high, exact = (
                (value, value, rows)
                if isinstance(value, np.ndarray)
                else (
                    value.low,
                    value.high,
                    int(np.sum(value.exact_low & value.exact_high)),
                )
            )
            self.exact[key] += exact
            self.sums[key][0] += float(low.sum())
            self.sums[key][1] += float(high.sum())
            coarse = []
            for side, column in enumerate((low, high)):
                self.hist[key][side] += np.bincount(_bins(column, HIST_BINS), minlength=HIST_BINS)
                coarse.append(_bins(column, GROUP_HIST_BINS))
            for label, mask in labels.items():
                if not mask.any():
                    continue
                group = self.groups.setdefault(label, {"positions": 0, "sums": {}, "hist": {}})
                pair = group["sums"].setdefault(_key(key), [0.0, 0.0])
                pair[0] += float(low[mask].sum())
                pair[1] += float(high[mask].sum())
                counts = group["hist"].setdefault(_key(key), [[0] * GROUP_HIST_BINS, [0] * GROUP_HIST_BINS])
                for side in (0, 1):
                    added = np.bincount(coarse[side][mask], minlength=GROUP_HIST_BINS)
                    counts[side] = (np.asarray(counts[side]) + added).tolist()
        for label, mask in labels.items():
            if mask.any():
                group = self.groups.setdefault(label, {"positions": 0, "sums": {}, "hist": {}})
                group["positions"] += int(mask.sum())

    def to_json(self) -> dict:
        return {
            "positions": self.positions,
            "sums": {_key(k): v for k, v in self.sums.items() if k not in self.missing},
            "exact": {_key(k): v for k, v in self.exact.items() if k not in self.missing},
            "hist": {_key(k): v.tolist() for k, v in self.hist.items() if k not in self.missing},
            "not_applicable": sorted(_key(k) for k in self.missing),
            "groups": self.groups,
        }


def _feature_order(label: str):
    """Entropy bins in increasing order, then temperatures by value (unknown last)."""
    feature, _, value = label.partition(" ")
    if feature == "entropy":
        return (0, entropy_bins().index(value) if value in entropy_bins() else 99, 0.0)
    try:
        return (1, 0, float(value))
    except ValueError:
        return (2, 0, 0.0)


def _key(key: tuple[str, int]) -> str:
    return f"{key[0]}@{key[1]}"


def bound_shard(
    path: str,
    ns,
    *,
    drafts=DRAFTS,
    verifiers=VERIFIERS,
    chunk_bytes: int = CHUNK_BYTES,
    wor_low: str = "dust",
) -> dict:
    """Summary of one shard; raises :class:`LogError` (a ValueError) if any row of it is unusable.

    The bounds run inside :func:`experiments.allocator.retained_heap`: on a Dask worker (whose nanny sets
    ``MALLOC_TRIM_THRESHOLD_``) every large temporary would otherwise be a fresh ``mmap`` and its page faults
    took more CPU than the arithmetic. The values do not depend on it.
    """
    with retained_heap():
        return _bound_shard(path, ns, drafts, verifiers, chunk_bytes, wor_low)


def _bound_shard(path, ns, drafts, verifiers, chunk_bytes, wor_low) -> dict:
    shard = LogShard.open(path)
    names = quantity_names(ns, drafts, verifiers)
    summary = _Summary(names)
    for start, chunk in _blocks(shard, chunk_bytes):
        rows = len(chunk["p"] if shard.kind == "full" else chunk["p_ids"])
        temperature = np.asarray(chunk.get("temperature", np.full(rows, np.nan)), dtype=np.float64)
        if shard.kind == "full":
            p, q = _check_full(chunk["p"].astype(np.float64), chunk["q"].astype(np.float64), start)
            values = _full_values(p, q, names, shard.vocab_size)
            features = entropy(p)
        else:
            try:
                values, _, logged = _topk_values(chunk, shard.vocab_size, names, wor_low)
            except LogError:
                raise
            except ValueError as error:
                raise LogError(f"rows {start}..{start + rows - 1}: {error}") from None
            features = chunk.get("entropy", logged)
        summary.add(values, np.asarray(features, dtype=np.float64), temperature)
    result = summary.to_json()
    result.update(kind=shard.kind, vocab_size=shard.vocab_size, width=_width(shard))
    return result


def _blocks(shard: LogShard, chunk_bytes: int):
    """The shard's read chunks, top-k ones cut into blocks of :data:`TOPK_BLOCK_ROWS` rows.

    A 32 MB read chunk of a top-20 log holds 10^5 rows; the bounds' temporaries are a few times ``rows x (k_p +
    k_q)`` floats, and the without-replacement dust bound's ``rows x n(n-1)/0.02`` (2 800 columns at n = 8): on
    a whole chunk that is gigabytes, beyond the worker's memory limit, and far out of cache. Blocks keep the
    temporaries near 100 MB at most (a few MB without the dust bound), whatever the shard's size.
    """
    for start, chunk in shard.chunks(chunk_bytes):
        rows = len(chunk["p"] if shard.kind == "full" else chunk["p_ids"])
        if shard.kind == "full" or rows <= TOPK_BLOCK_ROWS:
            yield start, chunk
            continue
        for offset in range(0, rows, TOPK_BLOCK_ROWS):
            yield (
                start + offset,
                {name: values[offset : offset + TOPK_BLOCK_ROWS] for name, values in chunk.items()},
            )


def _width(shard: LogShard) -> list[int] | None:
    if shard.kind != "topk":
        return None
    import zipfile

    from experiments.logformat import _MemberStream

    with zipfile.ZipFile(shard.path) as archive:
        return [_MemberStream(archive, f"{side}_ids").shape[1] for side in ("p", "q")]


def safe_bound_shard(
    path: str, ns, drafts=DRAFTS, verifiers=VERIFIERS, chunk_bytes: int = CHUNK_BYTES, wor_low: str = "dust"
) -> dict:
    """:func:`bound_shard`, but a bad shard returns ``{"error": message}`` instead of raising."""
    try:
        return bound_shard(
            path, ns, drafts=drafts, verifiers=verifiers, chunk_bytes=chunk_bytes, wor_low=wor_low
        )
    except (LogError, ValueError, OSError) as error:
        return {"error": str(error) or type(error).__name__}


def _entry(low_sum: float, high_sum: float, count: int) -> dict:
    low, high = low_sum / count, high_sum / count
    return {"mean": 0.5 * (low + high), "low": low, "high": high}


def _quantiles(hist: np.ndarray) -> dict:
    """Quantiles read off a histogram on [0, 1] (the centre of the bin holding each; +-0.5 / bins)."""
    hist = np.asarray(hist)
    cumulative = np.cumsum(hist) / max(hist.sum(), 1)
    return {f"{q:g}": float((np.searchsorted(cumulative, q) + 0.5) / len(hist)) for q in QUANTILES}


def aggregate(results: dict[str, dict], ns, drafts=DRAFTS, verifiers=VERIFIERS) -> dict:
    """Merge shard summaries (in sorted shard-name order) into the report's numbers."""
    names = [_key(k) for k in quantity_names(ns, drafts, verifiers)]
    good = {name: r for name, r in sorted(results.items()) if "error" not in r}
    skipped = [{"shard": name, "error": r["error"]} for name, r in sorted(results.items()) if "error" in r]
    total = sum(r["positions"] for r in good.values())
    sums = {k: [0.0, 0.0] for k in names}
    exact = dict.fromkeys(names, 0)
    hist = {k: np.zeros((2, HIST_BINS), dtype=np.int64) for k in names}
    missing, groups = set(), {}
    for r in good.values():
        missing |= set(r["not_applicable"])
        for k in names:
            if k in r["sums"]:
                sums[k][0] += r["sums"][k][0]
                sums[k][1] += r["sums"][k][1]
                exact[k] += r["exact"][k]
                hist[k] += np.asarray(r["hist"][k], dtype=np.int64)
        for label, group in r["groups"].items():
            target = groups.setdefault(label, {"positions": 0, "sums": {}, "hist": {}})
            target["positions"] += group["positions"]
            for k, pair in group["sums"].items():
                acc = target["sums"].setdefault(k, [0.0, 0.0])
                acc[0] += pair[0]
                acc[1] += pair[1]
            for k, counts in group.get("hist", {}).items():
                acc = target["hist"].setdefault(k, np.zeros((2, GROUP_HIST_BINS), dtype=np.int64))
                acc += np.asarray(counts, dtype=np.int64)

    def stats(k: str) -> dict | None:
        if k in missing or total == 0:
            return None
        entry = _entry(*sums[k], total)
        entry["exact_fraction"] = exact[k] / total
        entry["quantiles_low"] = _quantiles(hist[k][0])
        entry["quantiles_high"] = _quantiles(hist[k][1])
        entry["histogram"] = {"bins": HIST_BINS, "low": hist[k][0].tolist(), "high": hist[k][1].tolist()}
        return entry

    optimal = {d: {str(n): stats(f"{d}@{n}") for n in ns} for d in drafts}
    table = {}
    for name in verifiers:
        rows = {}
        for n in ns:
            if name == "spechub" and n != 2:
                continue
            entry = stats(f"{name}@{n}")
            law = VERIFIER_LAW[name]
            best = optimal.get(law, {}).get(str(n)) if law in drafts else entry
            if entry is not None and best is not None:
                entry["efficiency"] = {
                    "low": entry["low"] / best["high"] if best["high"] > 0 else 1.0,
                    "high": min(entry["high"] / best["low"], 1.0) if best["low"] > 0 else 1.0,
                }
            rows[str(n)] = entry
        table[name] = {"draft": VERIFIER_LAW[name], "n": rows}
    by_feature = {}
    for label, group in sorted(groups.items(), key=lambda item: _feature_order(item[0])):
        count = group["positions"]
        feature, _, value = label.partition(" ")
        by_feature[label] = {"positions": count, "feature": feature, "bin": value}
        for k, pair in sorted(group["sums"].items()):
            if k in missing:
                continue
            entry = by_feature[label][k] = _entry(*pair, count)
            counts = group["hist"].get(k)
            if counts is not None:
                entry["quantiles_low"] = _quantiles(counts[0])
                entry["quantiles_high"] = _quantiles(counts[1])
                entry["histogram"] = {
                    "bins": GROUP_HIST_BINS,
                    "low": np.asarray(counts[0]).tolist(),
                    "high": np.asarray(counts[1]).tolist(),
                }
    kinds = sorted({r["kind"] for r in good.values()})
    return {
        "positions": total,
        "kinds": kinds,
        "n": list(ns),
        "overlap": stats("overlap@1"),
        "optimal": optimal,
        "verifiers": table,
        "by_feature": by_feature,
        "shards": {
            "total": len(results),
            "used": len(good),
            "skipped_count": len(skipped),
            "skipped": skipped,
            "per_shard": {
                name: {"positions": r["positions"], "kind": r["kind"], "width": r["width"]}
                for name, r in good.items()
            },
        },
    }
