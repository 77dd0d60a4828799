"""The one table of draft laws and multi-draft verifiers: names, draft law, constraints on ``n``, references.

Every other module reads its names and constraints from here: :mod:`theory.draft_laws` and
:mod:`theory.verifiers` (the exact numpy algorithms), :mod:`theory.multidraft` (the optimal acceptance of a
draft law), and the executor's torch twins (:mod:`executor.sampling`, :mod:`executor.verification`). The
module imports neither numpy nor torch, so both sides can share it.

A draft law turns one draft distribution ``q`` into ``n`` ordered drafts (Hu et al., "Towards Optimal
Multi-draft Speculative Decoding", ICLR 2025, arXiv 2502.18779). A law whose drafts are distinct tokens
needs ``n`` tokens with ``q > 0``; SpecHub's law is defined for ``n = 2`` only. :func:`check_draft_count` is
the single place where these two constraints are checked.

To add a verifier, add a :class:`VerifierEntry` to :data:`VERIFIER_TABLE` and its class to
:mod:`theory.verifiers` (and, for the executor, a torch kernel to :mod:`executor.verification`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DRAFT_LAWS",
    "DRAFT_LAW_TABLE",
    "DraftLawEntry",
    "VERIFIERS",
    "VERIFIER_TABLE",
    "VerifierEntry",
    "check_draft_count",
    "draft_count_problem",
    "verifier_draft_law",
]


@dataclass(frozen=True)
class DraftLawEntry:
    """One draft law.

    Attributes
    ----------
    name : str
        As passed to ``draft=`` everywhere.
    distinct : bool
        The ``n`` drafts are distinct tokens, so ``q`` needs at least ``n`` tokens with ``q > 0``.
    fixed_n : int or None
        The only ``n`` the law is defined for (``None``: any ``n >= 1``).
    reference : str
        Where the law comes from.
    """

    name: str
    distinct: bool
    fixed_n: int | None
    reference: str


#: Draft laws by name (see :mod:`theory.draft_laws` for their formulas).
DRAFT_LAW_TABLE: dict[str, DraftLawEntry] = {
    entry.name: entry
    for entry in (
        DraftLawEntry(
            "iid", False, None, "with replacement; SpecInfer (arXiv 2305.09781), SpecTr (2310.15141)"
        ),
        DraftLawEntry(
            "wor", True, None, "without replacement, successive sampling; Jeon et al. (arXiv 2402.05109)"
        ),
        DraftLawEntry(
            "greedy", True, None, "top n - 1 of q plus one draw; Hu et al., ICLR 2025 (2502.18779)"
        ),
        DraftLawEntry("spechub", True, 2, "hub pair law; Sun et al., SpecHub, EMNLP 2024 (arXiv 2411.05289)"),
        DraftLawEntry("independent", False, None, "one draft model per draft; SpecInfer (arXiv 2305.09781)"),
    )
}
DRAFT_LAWS = tuple(DRAFT_LAW_TABLE)


@dataclass(frozen=True)
class VerifierEntry:
    """One multi-draft verifier.

    Attributes
    ----------
    name : str
        As passed to :func:`theory.verifier` and to the executor's ``verifier=``.
    draft : str
        The draft law the verifier is lossless for (its default, when ``draft_options`` allows others).
    draft_options : tuple of str
        Other draft laws the verifier can be built for (``verifier(name, draft=...)``); empty when fixed.
    reference : str
        The paper the algorithm comes from.
    """

    name: str
    draft: str
    reference: str
    draft_options: tuple[str, ...] = ()

    @property
    def fixed_n(self) -> int | None:
        """The only ``n`` the verifier's draft law allows, or ``None``."""
        return DRAFT_LAW_TABLE[self.draft].fixed_n


#: Multi-draft verifiers by name, in the order the documentation lists them.
VERIFIER_TABLE: dict[str, VerifierEntry] = {
    entry.name: entry
    for entry in (
        VerifierEntry(
            "nss", "iid", "naive speculative sampling; SpecInfer, Miao et al., ASPLOS 2024 (2305.09781)"
        ),
        VerifierEntry(
            "naive", "iid", "single-draft rule on x_1; Leviathan et al., ICML 2023 (arXiv 2211.17192)"
        ),
        VerifierEntry("rrs", "iid", "recursive rejection sampling; SpecInfer, Miao et al., ASPLOS 2024"),
        VerifierEntry(
            "rrs_wor", "wor", "RRS without replacement; Jeon et al. (2402.05109), Sequoia (2402.12374)"
        ),
        VerifierEntry(
            "kseq", "iid", "K-SEQ at the optimal division factor; SpecTr, Sun et al., NeurIPS 2023"
        ),
        VerifierEntry("spechub", "spechub", "SpecHub, Sun et al., EMNLP 2024 (arXiv 2411.05289)"),
        VerifierEntry(
            "greedy", "greedy", "greedy draft law's verifier; Hu et al., ICLR 2025 (arXiv 2502.18779)"
        ),
        VerifierEntry(
            "optimal",
            "iid",
            "optimal transport with membership cost; SpecTr (2310.15141), Hu et al., ICLR 2025",
            draft_options=("iid", "wor", "greedy", "spechub"),
        ),
    )
}
VERIFIERS = tuple(VERIFIER_TABLE)


def verifier_draft_law(name: str) -> str:
    """The draft law the verifier ``name`` is lossless for; ``ValueError`` naming ``name`` if unknown."""
    if name not in VERIFIER_TABLE:
        raise ValueError(f"name must be one of {', '.join(map(repr, VERIFIERS))}; got {name!r}")
    return VERIFIER_TABLE[name].draft


def draft_count_problem(draft: str, n: int, support: int, where: str = "q") -> str | None:
    """What stops ``draft`` from producing ``n`` drafts from a ``q`` with ``support`` tokens ``> 0``, or ``None``.

    ``where`` names the distribution in the message (``"q"``, ``"a row of q"``).
    """
    entry = DRAFT_LAW_TABLE[draft]
    if entry.fixed_n is not None and n != entry.fixed_n:
        return f"n must be {entry.fixed_n} for draft={draft!r} (its law is defined for {entry.fixed_n} drafts), got {n}"
    if entry.distinct and n > 1 and support < n:
        return f"n = {n} drafts with draft={draft!r} need at least n tokens with q > 0; {where} has {support}"
    return None


def check_draft_count(draft: str, n: int, support: int, where: str = "q") -> None:
    """Raise ``ValueError`` with :func:`draft_count_problem`'s message if the law cannot draw ``n`` drafts."""
    problem = draft_count_problem(draft, n, support, where)
    if problem is not None:
        raise ValueError(problem)
