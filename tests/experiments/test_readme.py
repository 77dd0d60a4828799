"""The README's examples run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_opens_with_the_two_fresh_machine_commands():
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.DOTALL).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert commands == [
        "bash scripts/setup.sh && .venv/bin/specbound validate",
        "bash scripts/setup.sh && .venv/bin/python -m pytest -n 2",
    ]
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci, ".ci/run must run the README's test command"


@pytest.mark.slow
def test_readme_python_example_runs():
    (block,) = python_blocks()
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 (our own documentation)
    assert namespace["result"].n_tokens > 0
