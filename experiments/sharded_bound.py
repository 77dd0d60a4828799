"""``bound --logs``: bounds over many log shards, one task per shard on a Dask distributed cluster.

Each shard is summarised independently (:func:`experiments.log_bounds.safe_bound_shard`, streaming within the
shard so a worker's memory is bounded by the chunk size), on a ``LocalCluster`` of ``workers`` processes or on
an existing scheduler (``scheduler="tcp://host:8786"``): the same code on one laptop or a hundred machines.
``workers=0`` runs every shard in this process (no Dask), the reference the cluster run must equal.

With ``out``, every shard's summary is written atomically to ``out/shards/<key>.json`` as soon as it arrives,
keyed by the shard's path, size, modification time and the settings; a rerun loads those and computes only
the rest, so an interrupted run resumes. A worker that dies mid-shard is replaced and its shard recomputed by
Dask (up to ``allowed-failures`` times). Bad shards (unreadable, wrong shapes, NaN, sums above 1) are reported
by name with the reason and left out of every average; they never stop the others (and are not cached, so a
fixed file is picked up by the next run).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from experiments.log_bounds import DRAFTS, VERIFIERS, aggregate, safe_bound_shard
from experiments.logformat import CHUNK_BYTES

#: Bumped when a shard's summary changes (its bounds or fields), so cached summaries are not reused.
SUMMARY_VERSION = 2
#: Per-worker memory limit of the LocalCluster (Dask pauses, then restarts, a worker above it).
WORKER_MEMORY = "1GiB"


def shard_key(path: str, settings: dict) -> str:
    """Cache key: the shard's absolute path, size and mtime, and the settings that change its summary."""
    stat = os.stat(path)
    text = json.dumps([os.path.abspath(path), stat.st_size, stat.st_mtime_ns, settings], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def find_shards(pattern: str) -> list[str]:
    paths = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not paths:
        raise ValueError(f"--logs: no file matches {pattern!r}")
    return paths


def run_sharded(
    pattern: str,
    ns,
    *,
    drafts=DRAFTS,
    verifiers=VERIFIERS,
    workers: int = 2,
    scheduler: str | None = None,
    out: str | os.PathLike | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    wor_low: str = "dust",
    progress: bool = True,
    processes: bool = True,
    shard_function: Callable = safe_bound_shard,
) -> dict:
    """Summarise every shard matching ``pattern`` and aggregate; returns the report dict.

    ``processes=False`` runs the LocalCluster's workers as threads of this process (tests). ``shard_function``
    replaces the per-shard task (tests inject faults with it); it must accept the arguments of
    :func:`experiments.log_bounds.safe_bound_shard`.
    """
    paths = find_shards(pattern)
    if workers < 0:
        raise ValueError(f"--workers must be >= 0, got {workers}")
    ns = [int(n) for n in ns]
    settings = {
        "n": ns,
        "drafts": list(drafts),
        "verifiers": list(verifiers),
        "wor_low": wor_low,
        "summary": SUMMARY_VERSION,
    }
    cache = Path(out) / "shards" if out is not None else None
    results: dict[str, dict] = {}
    todo = []
    for path in paths:
        key = shard_key(path, settings)
        file = cache / f"{key}.json" if cache else None
        if file is not None and file.exists():
            results[path] = json.loads(file.read_text())
        else:
            todo.append((path, file))

    def store(path: str, file: Path | None, result: dict) -> None:
        results[path] = result
        if file is not None and "error" not in result:
            # Imported only to write (it imports torch with the executor): a run without --out stays torch-free.
            from executor.files import write_json

            write_json(result, file, indent=None)

    from tqdm import tqdm

    bar = tqdm(
        total=len(paths), initial=len(paths) - len(todo), desc="shards", unit="shard", disable=not progress
    )
    arguments = (ns, tuple(drafts), tuple(verifiers), chunk_bytes, wor_low)
    try:
        if scheduler is None and workers == 0:
            for path, file in todo:
                store(path, file, shard_function(path, *arguments))
                bar.update()
        elif todo:
            _run_on_dask(todo, arguments, workers, scheduler, processes, shard_function, store, bar)
    finally:
        bar.close()
    report = aggregate({_name(p, paths): r for p, r in results.items()}, ns, drafts, verifiers)
    report["logs"] = pattern
    report["shards"]["computed_now"] = len(todo)
    return report


def _run_on_dask(todo, arguments, workers, scheduler, processes, shard_function, store, bar) -> None:
    from distributed import Client, LocalCluster, as_completed

    if scheduler is not None:
        client, cluster = Client(scheduler), None
    else:
        if workers < 1:
            raise ValueError(f"--workers must be >= 1 for a LocalCluster, got {workers}")
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=processes,
            memory_limit=WORKER_MEMORY if processes else None,
            dashboard_address=":0",
        )
        client = Client(cluster)
    try:
        futures = {}
        for path, file in todo:
            future = client.submit(
                shard_function, path, *arguments, pure=False, key=f"shard-{shard_key(path, {})}"
            )
            futures[future] = (path, file)
        for future in as_completed(futures):
            path, file = futures[future]
            try:
                result = future.result()
            except Exception as error:  # a task that failed on every worker it was given
                result = {"error": f"task failed: {type(error).__name__}: {error}"}
            store(path, file, result)
            bar.update()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _name(path: str, paths: list[str]) -> str:
    """A shard's name in the report: its path relative to the shards' common directory."""
    root = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in paths])
    return os.path.relpath(os.path.abspath(path), root)
