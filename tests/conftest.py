"""Shared test configuration: hypothesis profiles and torch threads.

Every property runs at least 200 examples. On CI (the ``CI`` environment variable is set) the examples are
derandomised so that a red run reproduces exactly on a developer's machine.
"""

import os

import torch
from hypothesis import HealthCheck, settings

# One torch thread per test process: determinism, and fair sharing of a 2-core machine under ``pytest -n 2``.
torch.set_num_threads(1)

settings.register_profile(
    "dev",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("ci", parent=settings.get_profile("dev"), derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
