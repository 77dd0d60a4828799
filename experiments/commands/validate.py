"""``specbound validate``: the main job -- the theory predicts, then the executor runs (:mod:`experiments.apriori`).

The replay check (each verifier against its theory twin on the logged distributions) is the report's second column.
"""

from __future__ import annotations

from experiments.apriori.cli import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
