"""``retained_heap``: large temporaries stop page-faulting under Dask's trim threshold; the process's settings return."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import allocator

ROOT = Path(__file__).resolve().parents[2]
LOOPS = 40
PAGES = 512  # one 2 MiB array: 512 pages of 4 KiB, each faulted in on first touch when it is a fresh mmap

SCRIPT = f"""
import json, resource
import numpy as np
from experiments.allocator import retained_heap

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range({LOOPS}):
        block = np.empty(1 << 18)  # 2 MiB of float64
        block.fill(1.0)
        del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

counts = {{"before": faults()}}
with retained_heap():
    faults()  # the heap grows once
    counts["inside"] = faults()
    with retained_heap():
        pass
    counts["after an inner block"] = faults()
counts["after"] = faults()
print(json.dumps(counts))
"""


def fault_counts(**environment) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(environment, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


needs_glibc = pytest.mark.skipif(allocator._LIBC is None, reason="mallopt is glibc's")


@needs_glibc
def test_under_dasks_trim_threshold_large_temporaries_fault_only_outside_the_block():
    counts = fault_counts(MALLOC_TRIM_THRESHOLD_="65536")  # what Dask's nanny sets for its workers
    # Negative control: in Dask's setting every 2 MiB array is a fresh mmap, faulted in page by page.
    assert counts["before"] >= LOOPS * PAGES * 0.9
    # Inside, the freed array is reused from the heap: no page faults at all (a few stray ones allowed).
    assert counts["inside"] < LOOPS
    assert counts["after an inner block"] < LOOPS  # leaving a nested block keeps the outer one's setting
    # Leaving the outermost block restores the thresholds the process was started with.
    assert counts["after"] >= LOOPS * PAGES * 0.9


@needs_glibc
def test_a_process_without_configured_thresholds_keeps_the_raised_ones():
    counts = fault_counts()
    assert counts["inside"] < LOOPS
    # malloc_trim gave the heap back on leaving: the first array after it is faulted in once, the rest reuse it.
    assert counts["after"] < PAGES + LOOPS


def test_the_block_does_nothing_without_glibc(monkeypatch):
    monkeypatch.setattr(allocator, "_LIBC", None)
    with allocator.retained_heap():
        assert allocator._depth == 0
