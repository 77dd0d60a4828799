"""The optimal-transport verifier of a draft law (exact, small vocabularies)."""

from __future__ import annotations

import numpy as np

from theory.checks import as_choice
from theory.verifier_table import VERIFIER_TABLE
from theory.verifiers.base import Verifier, _draw


class OptimalTransportVerifier(Verifier):
    r"""The optimal verifier of a draft law: :math:`\pi(y \mid \bar x) = \pi^*(\bar x, y)/P(\bar x)` from an
    optimal coupling of the optimal-transport problem with membership cost (Sun et al., SpecTr, NeurIPS 2023;
    Hu et al., ICLR 2025, arXiv 2502.18779), taken from
    :func:`theory.multidraft.optimal_acceptance_certificate`.

    It attains :math:`\alpha^*(P)` exactly and is lossless by the coupling's target marginal. Small ``V`` only
    (the coupling has one row per draft tuple). Sampling draws the output from the coupling row, which *is*
    this algorithm. The last certificate is cached, since tests and :meth:`sample` ask for the same pair.
    """

    name = "optimal"

    def __init__(self, draft: str = "iid"):
        self.draft = as_choice(draft, "draft", VERIFIER_TABLE[self.name].draft_options)
        self._cache: tuple[bytes, object] | None = None

    def _certificate(self, p, q, n):
        from theory.multidraft import optimal_acceptance_certificate

        key = p.tobytes() + q.tobytes() + n.to_bytes(4, "little")
        if self._cache is None or self._cache[0] != key:
            certificate = optimal_acceptance_certificate(p, q, n, draft=self.draft)
            if certificate.coupling is None:
                raise ValueError(f"no optimal coupling is available for V = {p.shape[-1]}, n = {n}")
            rows = {tuple(map(int, row)): index for index, row in enumerate(certificate.drafts)}
            self._cache = (key, (certificate, rows))
        return self._cache[1]

    def _acceptance(self, p, q, n):
        from theory.multidraft import optimal_acceptance

        return optimal_acceptance(p, q, n, draft=self.draft)

    def _conditional(self, p, q, drafts):
        certificate, rows = self._certificate(p, q, drafts.shape[1])
        indices = []
        for row in drafts:
            index = rows.get(tuple(map(int, row)))
            if index is None or certificate.draft_probabilities[index] <= 0:
                raise ValueError(f"drafts {row.tolist()} has probability 0 under draft={self.draft!r}")
            indices.append(index)
        indices = np.array(indices)
        coupling = np.maximum(np.asarray(certificate.coupling)[indices], 0.0)
        return coupling / coupling.sum(axis=-1, keepdims=True)

    def _simulate(self, p, q, drafts, rng):
        return _draw(self._conditional(p, q, drafts[None, :])[0], rng)
