r"""Multi-draft verification algorithms: exact acceptance, exact output law, and a step-by-step simulation.

A verifier is a conditional law :math:`\pi(y \mid \bar x)` of the output token ``y`` given the ordered drafts
:math:`\bar x = (x_1, \dots, x_n)` drawn from a draft law :math:`P` (see :mod:`theory.draft_laws`). It is
lossless iff :math:`\sum_{\bar x} P(\bar x)\, \pi(y \mid \bar x) = p(y)` for every ``y``, and its acceptance
rate is :math:`\alpha = P(y \in \bar x)` (Hu et al., ICLR 2025, arXiv 2502.18779; Sun et al., SpecTr,
NeurIPS 2023, arXiv 2310.15141).

Every verifier exposes the same four routes, which the tests play against each other:

``acceptance(p, q, n)``
    exact acceptance rate (closed form where one exists, else an exact recursion), batched where the
    closed form allows;
``conditional(p, q, drafts)``
    the exact output distribution given one ordered draft tuple (``(n,)``) or a stack of them (``(M, n)``):
    the verifier's definition;
``output_distribution(p, q, n)``
    :math:`\sum_{\bar x} P(\bar x)\, \pi(\cdot \mid \bar x)` by enumerating the draft law (small ``V``);
``sample(p, q, n, rng)``
    one step, drafts from :func:`theory.draft_laws.sample_drafts` and then the algorithm run with coin flips.

``p`` is the target distribution and ``q`` the draft distribution throughout (several papers swap them).
"""

from __future__ import annotations

from theory.checks import as_choice
from theory.verifier_table import VERIFIER_TABLE, VERIFIERS
from theory.verifiers.base import Verifier
from theory.verifiers.iid import (
    KSequential,
    NaiveSpeculativeSampling,
    NaiveTree,
    RecursiveRejectionSampling,
    _kseq_conditional,
)
from theory.verifiers.own_laws import (
    RRS_WOR_MAX_PATHS,
    GreedyDraftVerifier,
    RecursiveRejectionSamplingWithoutReplacement,
    SpecHub,
)
from theory.verifiers.transport import OptimalTransportVerifier

__all__ = [
    "GreedyDraftVerifier",
    "KSequential",
    "NaiveSpeculativeSampling",
    "NaiveTree",
    "OptimalTransportVerifier",
    "RecursiveRejectionSampling",
    "RecursiveRejectionSamplingWithoutReplacement",
    "RRS_WOR_MAX_PATHS",
    "SpecHub",
    "VERIFIERS",
    "Verifier",
    "verifier",
    "_kseq_conditional",
]


#: The class of each entry of :data:`theory.verifier_table.VERIFIER_TABLE`.
_CLASSES = {
    cls.name: cls
    for cls in (
        NaiveSpeculativeSampling,
        NaiveTree,
        RecursiveRejectionSampling,
        RecursiveRejectionSamplingWithoutReplacement,
        KSequential,
        SpecHub,
        GreedyDraftVerifier,
        OptimalTransportVerifier,
    )
}


def verifier(name: str, **options) -> Verifier:
    """The verification algorithm called ``name``, with its draft law.

    Parameters
    ----------
    name : str
        ``"nss"``, ``"naive"``, ``"rrs"`` (SpecInfer, i.i.d. drafts), ``"rrs_wor"`` (without replacement, draw
        order), ``"kseq"`` (SpecTr K-SEQ at the optimal division factor), ``"spechub"`` (``n = 2``),
        ``"greedy"`` (Hu et al.'s greedy draft law) or ``"optimal"`` (for i.i.d. drafts the run-time
        construction of :func:`theory.optimal_verifier`, any V; for the other laws, or with ``method="lp"``,
        the optimal-transport LP coupling, small V).
    **options
        Only ``"optimal"`` takes them: ``draft`` (``"iid"`` by default, or ``"wor"``, ``"greedy"``,
        ``"spechub"``) and ``method`` (``"auto"`` or ``"lp"``).

    Examples
    --------
    >>> import numpy as np
    >>> from theory import verifier
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> round(float(verifier("rrs").acceptance(p, q, 2)), 6)
    0.76
    """
    name = as_choice(name, "name", VERIFIERS)
    if options and not VERIFIER_TABLE[name].draft_options:
        raise ValueError(f"verifier {name!r} takes no options, got {sorted(options)}")
    if set(options) - {"draft", "method"}:
        raise ValueError(
            f"verifier {name!r} only takes the options 'draft' and 'method' ('lp' for the LP oracle), "
            f"got {sorted(options)}"
        )
    method = as_choice(options.pop("method", "auto"), "method", ("auto", "lp"))
    if name == "optimal" and options.get("draft", "iid") == "iid" and method == "auto":
        from theory.optimal_verifier import RuntimeOptimalVerifier  # i.i.d. drafts: the run-time construction

        return RuntimeOptimalVerifier()
    return _CLASSES[name](**options)
