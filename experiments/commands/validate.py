"""``specbound validate``: the main job -- the theory predicts, then the executor runs (:mod:`experiments.apriori`).

The replay check of :mod:`experiments.validate` is the report's second column.
"""

from __future__ import annotations

from experiments.apriori.cli import HELP, add_arguments, run

__all__ = ["HELP", "add_arguments", "run"]
