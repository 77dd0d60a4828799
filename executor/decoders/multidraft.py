"""Multi-draft speculative sampling: ``n`` drafts for the next position, one verifier.

Each step draws ``n`` drafts from the draft distribution ``q`` with the verifier's draft law and verifies
them against the target ``p`` with the torch twin of a theory verifier (same names): ``"rrs"``
(SpecInfer's recursive rejection sampling, i.i.d. drafts), ``"rrs_wor"`` (without replacement),
``"kseq"`` (SpecTr's K-SEQ, Sun et al., NeurIPS 2023, arXiv 2310.15141), ``"spechub"`` (``n = 2``, Sun et
al., EMNLP 2024, arXiv 2411.05289) and ``"greedy"`` (Hu et al., ICLR 2025, arXiv 2502.18779). The
acceptance of one step is :math:`\\alpha = P(\\text{output} \\in \\text{drafts})`, which
:func:`theory.optimal_acceptance` bounds. An accepted draft is followed by a bonus token from the target,
so a step emits 1 or 2 tokens.

This is the token tree whose root has ``n`` children (:class:`executor.decoders.tree.TreeDecoder`).
"""

from __future__ import annotations

from executor.decoders.base import Sampling
from executor.decoders.tree import TreeDecoder
from theory.checks import as_count
from theory.verifier_table import VERIFIER_TABLE

__all__ = ["MultiDraftDecoder"]


class MultiDraftDecoder(TreeDecoder):
    """``n`` drafts per step verified with ``verifier`` (default ``"rrs"``); greedy argmax at temperature 0.

    Parameters
    ----------
    target : executor.model.Transformer
    drafter : executor.drafters.Drafter
    n : int
        Drafts per step (exactly 2 for ``"spechub"``).
    verifier : str
        One of :data:`executor.decoders.tree.TREE_VERIFIERS`.
    sampling, log_distributions
        See :class:`executor.decoders.base.Decoder`.
    """

    name = "multidraft"

    def __init__(
        self,
        target,
        drafter,
        *,
        n: int = 2,
        verifier: str = "rrs",
        sampling: Sampling | None = None,
        log_distributions: str = "none",
    ) -> None:
        n = as_count(n, "n")
        fixed_n = VERIFIER_TABLE[verifier].fixed_n if verifier in VERIFIER_TABLE else None
        if fixed_n is not None and n != fixed_n:
            raise ValueError(f"n must be {fixed_n} for verifier {verifier!r}, got {n}")
        super().__init__(
            target,
            drafter,
            tree=[-1] + [0] * n,
            verifier=verifier,
            sampling=sampling,
            log_distributions=log_distributions,
        )
        self.n = n

    def settings(self) -> dict:
        return {**super().settings(), "n": self.n}
