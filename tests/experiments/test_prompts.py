"""The prompt sets: HumanEval from the installed package, and the project's own code and prose prompts."""

import pytest

from experiments.prompts import OTHER_PROMPTS, humaneval_prompts, prompt_set


def test_humaneval_set_is_the_first_problems_in_task_order():
    prompts = prompt_set("humaneval", 3)
    assert prompts == humaneval_prompts(3)
    assert prompts[0].startswith("from typing import List")  # HumanEval/0, has_close_elements


def test_other_set_is_disjoint_from_humaneval():
    assert len(prompt_set("other", len(OTHER_PROMPTS))) == len(OTHER_PROMPTS)
    assert not set(OTHER_PROMPTS) & set(humaneval_prompts())


@pytest.mark.parametrize(
    ("name", "count", "message"),
    [("wiki", 1, "prompt set must be"), ("other", 0, "count must be"), ("other", 99, "count must be")],
)
def test_bad_arguments_name_the_problem(name, count, message):
    with pytest.raises(ValueError, match=message):
        prompt_set(name, count)
