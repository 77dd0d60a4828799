"""Shared test configuration: hypothesis profiles and torch threads.

Every property runs 200 examples unless it sets its own count (ten costly ones, which run a model or an exact
enumeration per example, run 20-150). On CI (the ``CI`` environment variable is set) the examples are
derandomised so that a red run reproduces exactly on a developer's machine. ``--hypothesis-profile deep`` runs
ten times the examples (properties that fix their own count keep it), a bug hunt rather than a CI job.
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# One torch thread per test process: determinism, and fair sharing of a 2-core machine under ``pytest -n 2``.
torch.set_num_threads(1)


def _pin_xdist_worker_to_one_core() -> None:
    """Under ``pytest -n N`` each worker runs on its own core (worker i on core i mod cores).

    The CLI commands under test set torch's threads to the cores the process may use (the product's default);
    unpinned, two workers each ran 2 threads on 2 cores, and every small op paid for a descheduled OpenMP
    thread at its barrier: a tiny-model ``validate --quick`` took 176 s instead of 25 s.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})


_pin_xdist_worker_to_one_core()

settings.register_profile(
    "dev",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("ci", parent=settings.get_profile("dev"), derandomize=True, print_blob=True)
settings.register_profile("deep", parent=settings.get_profile("dev"), max_examples=2000, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="session", autouse=True)
def theory_native_code_loaded_before_any_test_patches_its_oracles():
    """Build (or load) and probe the theory's native code once, first.

    Its probes compare each C++ function with the numpy function it mirrors, and those read module constants
    that some tests patch (``MAX_UNITS``, ``RETRY_SHORTFALL``): a library first loaded inside such a test was
    refused for the whole worker process, and every native test after it failed.
    """
    from theory import _native

    with _native.enabled(True):
        _native.available()
