"""Falcon's custom decoding tree: levels come in pairs, one pair per semi-autoregressive drafter pass.

Falcon (Gao et al., AAAI 2025, arXiv 2412.12639, "Custom-Designed Decoding Tree") drafts ``k = 2`` tokens per
forward pass and runs several passes per step, so its static tree is built pass by pass: the first token of a
pass branches widely, the second token branches under the best few first tokens only, and the next pass
continues from the most probable path (the paper's hand-designed ``kmask2_8layer_tree`` is heavy on that path).

:func:`falcon_tree` builds that shape for ``passes`` passes: at the start node ``s`` of a pass, ``s`` gets
``width`` children (ranks ``0 .. width - 1``, the first token); the rank-0 child gets ``width`` children and the
rank-1 child one (the second token); the next pass starts at the rank-0 child's rank-0 child. Each pass adds
``2 * width + 1`` nodes (2 when ``width == 1``: a chain). The tree decoder drafts it level by
level; :class:`executor.drafters.FalconDrafter` answers two levels per head pass, so the tree costs ``passes``
drafter passes and is verified by the ordinary tree verification (lossless at any temperature).
"""

from __future__ import annotations

from theory.checks import as_count

__all__ = ["falcon_tree"]


def falcon_tree(passes: int = 2, width: int = 2) -> list[int]:
    """The parent array (root first, topological order) of Falcon's pass-by-pass tree; see the module."""
    passes, width = as_count(passes, "passes"), as_count(width, "width")
    parents = [-1]

    def add(parent: int, count: int) -> list[int]:
        parents.extend([parent] * count)
        return list(range(len(parents) - count, len(parents)))

    start = 0
    for _ in range(passes):
        first = add(start, width)
        second = add(first[0], width)
        if width > 1:
            add(first[1], 1)
        start = second[0]
    return parents
