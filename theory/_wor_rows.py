r"""The without-replacement quadrature of :mod:`theory._wor` on many short rows at once.

:func:`theory._wor.wor_prefix_minimiser` evaluates, per row, the prefixes that may minimise
:math:`P_k - Q_n(H_k)`. A row with at most :data:`theory._wor.PREFIX_BATCH` such prefixes is settled in one round
of its branch and bound, which evaluates all of them; top-k positions (tens of prefixes) are all like that, and
there the per-row Python steps of :class:`theory._wor._PrefixInclusion` (about 60 numpy calls on arrays of a few
thousand entries) cost far more than the arithmetic. :func:`evaluate_rows` does the same arithmetic for all such
rows together on padded arrays, so those steps are paid per call rather than per row.

Every value is bit for bit the one :class:`theory._wor._PrefixInclusion` computes for that row alone: each row
keeps its own grid (its own step and length, from its own smallest complement mass), token split and
thresholds; the padded entries are zeros placed *after* a row's own entries along every cumulative sum (which
are sequential, so a prefix of a cumulative sum does not see them) and outside every elementwise operation the
row reads; the two operations whose rounding depends on the shape, the matrix product of the moment series and
the trapezoid sum over the grid, are done per row on exactly the shapes of the one-row version. The formulas and
their error analysis are those of :func:`theory._wor.wor_prefix_inclusion`.
"""

from __future__ import annotations

import math

import numpy as np

from theory import _wor

#: Largest ``rows x tokens x grid points`` (times ``n``) of the padded temporaries of one call; more rows are
#: evaluated in several calls.
BATCH_ELEMENTS = 1 << 22
#: Most rows per call, and largest ratio of grid lengths within one call (rows sorted by grid length): more
#: rows share the per-call steps, but a few long grids (a tiny complement mass) would pad every other row.
GROUP_ROWS = 64
GROUP_PADDING = 1.25


def evaluate_rows(inclusion, needed, q_sorted, suffix, n: int, dust) -> None:
    """Set ``inclusion[b, k]`` to :math:`Q_n(H_k)` wherever ``needed[b, k]``, rows ``b`` of the batch at once.

    ``needed`` (B, K + 1) bool marks prefixes with ``s_k > 0`` (and ``k >= n`` for rows without dust);
    ``q_sorted`` (B, K), ``suffix`` (B, K + 1), ``dust`` (B,) as in :func:`theory._wor.wor_prefix_minimiser`.
    """
    rows = np.flatnonzero(needed.any(axis=1))
    if rows.size == 0:
        return
    last = (needed.shape[1] - 1) - np.argmax(needed[rows, ::-1], axis=1)  # each row's last needed prefix
    # Each row's grid length (from its smallest needed complement mass, as _log_grid sets it): rows of similar
    # grid length and width go together, in groups of at most GROUP_ROWS, so that little is padding.
    smallest = np.where(needed[rows], suffix[rows], np.inf).min(axis=1)
    u_low = math.log((math.factorial(n + 1) * _wor.TRUNCATION_ERROR) ** (1.0 / (n + 1)))
    u_high = np.log(math.log(1.0 / _wor.TRUNCATION_ERROR) / np.maximum(smallest, _wor.SMALLEST_COMPLEMENT))
    grid = np.ceil((u_high - u_low) / _wor.QUADRATURE_STEP) + 2  # (an estimate: + 1 for its rounding)
    order = np.lexsort((last, grid))
    rows, last, grid = rows[order], last[order], grid[order]
    start = 0
    while start < rows.size:
        stop = start + 1
        while (
            stop < rows.size
            and stop - start < GROUP_ROWS
            and grid[stop] <= GROUP_PADDING * grid[start]
            and (stop + 1 - start) * (int(last[stop]) + 2) * int(grid[stop]) * n <= BATCH_ELEMENTS
        ):
            stop += 1
        block = rows[start:stop]
        _Rows(q_sorted[block], suffix[block], n, needed[block], dust[block]).fill(inclusion, block)
        start = stop


class _Rows:
    """:class:`theory._wor._PrefixInclusion` of several rows, padded, for all of each row's needed prefixes."""

    def __init__(self, q, suffix, n, needed, dust):
        rows, width = q.shape
        self.n, self.needed, self.suffix, self.dust = n, needed, suffix, dust
        threshold = _wor._sure_threshold(n, width)
        reads = [np.flatnonzero(row) for row in needed]
        grids = [_wor._log_grid(n, float(s[r].min())) for s, r in zip(suffix, reads, strict=True)]
        self.sizes = np.array([g.size for g, _ in grids])
        size = int(self.sizes.max())
        self.grid, self.weights = np.ones((rows, size)), np.zeros((rows, size))
        for b, (g, w) in enumerate(grids):
            self.grid[b, : g.size], self.weights[b, : g.size] = g, w
        ends = np.array([int(r[-1]) for r in reads])  # the row's q is cut there, as in the one-row version
        tokens = int(ends.max())
        q = np.where(np.arange(tokens) < ends[:, None], q[:, :tokens], 0.0)

        # Grid points beyond theta / (n-th largest q before the first read): every read has n sure tokens there.
        usable = self.sizes.copy()  # rows whose first read has fewer than n tokens (dust): the whole grid
        for b, r in enumerate(reads):
            first = int(r[0])
            if first >= n:
                nth_largest = np.partition(q[b, :first], first - n)[first - n]
                usable[b] = np.searchsorted(self.grid[b, : self.sizes[b]] * nth_largest, threshold, "right")
        # The index of the n-th token sure by each usable point. A token not sure at a row's last usable point
        # is sure at none before it, so counting the tokens "capable" in any row counts the one-row version's.
        columns = int(usable.max())
        last_usable = self.grid[np.arange(rows), np.maximum(usable - 1, 0)]
        capable = np.flatnonzero(np.any(q * last_usable[:, None] > threshold, axis=0))
        sure_count = np.cumsum(q[:, capable, None] * self.grid[:, None, :columns] > threshold, axis=1)
        nth_sure = np.full((rows, size), -1)
        nth_sure[:, :columns] = ends[:, None]
        if capable.size:
            reaches = sure_count[:, -1, :] >= n
            first_n = capable[np.argmax(sure_count >= n, axis=1)]
            nth_sure[:, :columns] = np.where(reaches, first_n, ends[:, None])
        nth_sure[np.arange(size) >= usable[:, None]] = -1
        reads_before = np.concatenate([np.zeros((rows, 1), np.int64), np.cumsum(needed, axis=1)], axis=1)
        latest = np.take_along_axis(reads_before, nth_sure + 1, axis=1) - 1  # largest read k <= n-th sure
        read_index = np.zeros((rows, max(r.size for r in reads)), dtype=np.int64)
        for b, r in enumerate(reads):
            read_index[b, : r.size] = r
        smallest = np.take_along_axis(suffix, np.take_along_axis(read_index, np.maximum(latest, 0), 1), 1)
        alive = (latest >= 0) & (smallest * self.grid <= math.log(1.0 / _wor.TRUNCATION_ERROR))
        alive &= np.arange(size) < self.sizes[:, None]
        if np.any(dust > 0):
            alive &= ~((dust[:, None] > 0) & (dust[:, None] * self.grid > _wor._dust_sure_rate(n)))
        self.points = np.where(alive.any(axis=1), size - np.argmax(alive[:, ::-1], axis=1), 0)
        points = int(self.points.max())
        t = np.where(np.arange(points) < self.points[:, None], self.grid[:, :points], 0.0)
        self.t = t
        scale = np.where(self.points > 0, t[np.arange(rows), np.maximum(self.points - 1, 0)], 1.0)
        self.scale = scale

        # Large-clock tokens, moved to the front of each row in token order: the prefix recursion. Token-major
        # layout (J, ..., B, M'): a step along the tokens is one vector operation over every row and grid point.
        large = q * scale[:, None] > _wor.SMALL_CLOCK
        self.large_before = np.concatenate([np.zeros((rows, 1), np.int64), np.cumsum(large, axis=1)], 1)
        count = int(self.large_before[:, -1].max())
        order = np.argsort(~large, axis=1, kind="stable")[:, :count]
        large_q = np.where(
            np.arange(count) < self.large_before[:, -1:], np.take_along_axis(q, order, 1), 0.0
        ).T
        clock = large_q[:, :, None] * t[None, :, :]  # (J, B, M')
        sure = clock > threshold
        with np.errstate(over="ignore"):
            spread = np.expm1(clock)
        spread[sure] = 0.0
        # e_j after i tokens, all j at once: e_j(i + 1) = e_j(i) + w_i e_{j-1}(i), the one-row version's cumsum
        self.states = np.zeros((count + 1, n, rows, points))
        self.states[:, 0] = 1.0
        for i in range(count):
            np.add(self.states[i, 1:], spread[i] * self.states[i, :-1], out=self.states[i + 1, 1:])
        self.sure_count = np.zeros((count + 1, rows, points), dtype=np.int64)
        np.cumsum(sure, axis=0, out=self.sure_count[1:])
        self.unsure_mass = np.zeros((count + 1, rows, points))
        np.cumsum(np.where(sure, 0.0, large_q[:, :, None]), axis=0, out=self.unsure_mass[1:])

        # Small-clock tokens: prefix sums of (q scale)^r and the series in t / scale.
        coefficients = _wor._series_coefficients(n)
        orders = coefficients.shape[1] - 1
        small = np.where(large, 0.0, q) * scale[:, None]
        powers = np.empty((rows, orders, tokens))
        powers[:, 0] = small
        for r in range(1, orders):
            np.multiply(powers[:, r - 1], small, out=powers[:, r])
        self.moments = np.zeros((rows, orders, tokens + 1))
        np.cumsum(powers, axis=2, out=self.moments[:, :, 1:])
        ratio_powers = (t / scale[:, None])[:, None, :] ** np.arange(1, orders + 1)[None, :, None]
        # per row (n - 1, R, M'_b), contiguous like the one-row version's: the power sums are its products
        self.series = [coefficients[1:, 1:, None] * ratio_powers[b, :, : self.points[b]] for b in range(rows)]

    def fill(self, inclusion, block) -> None:
        n, rows_of = self.n, np.nonzero(self.needed)
        b, prefixes = rows_of
        points = self.t.shape[1]
        spans = np.concatenate([[0], np.cumsum(np.count_nonzero(self.needed, axis=1))])
        below = np.zeros((b.size, self.grid.shape[1]))
        if points:
            index = self.large_before[b, prefixes]
            moments = self.moments[b, :, prefixes]  # (P, R)
            # p_1..p_{n-1}: per row, the one-row version's matrix product on its shapes (rounding of BLAS).
            power_sums = [np.zeros((b.size, points)) for _ in range(n - 1)]
            for row in range(len(self.series)):
                lo, hi, width = spans[row], spans[row + 1], self.points[row]
                if hi == lo or width == 0:
                    continue
                row_moments = self.moments[row][:, prefixes[lo:hi]].T
                for m in range(n - 1):
                    power_sums[m][lo:hi, :width] = row_moments @ self.series[row][m]
            t = self.t[b]
            if np.any(self.dust > 0):
                dusty = self.dust[b] > 0
                power_sums[0] = np.where(
                    dusty[:, None], power_sums[0] + self.dust[b, None] * t, power_sums[0]
                )
            small_sums = [np.ones_like(power_sums[0])]
            for j in range(1, n):
                total = sum((-1) ** (i - 1) * small_sums[j - i] * power_sums[i - 1] for i in range(1, j + 1))
                small_sums.append(total / j)
            large_sums = self.states[index, :, b]  # (P, n, M')
            count = self.sure_count[index, b]
            rate = t * (moments[:, :1] / self.scale[b, None] + self.unsure_mass[index, b])
            if np.any(self.dust > 0):
                rate = np.where(dusty[:, None], rate + self.dust[b, None] * t, rate)
            probability = np.zeros_like(rate)
            for j in range(n):
                coefficient = sum(large_sums[:, i] * small_sums[j - i] for i in range(j + 1))
                probability += np.where(count + j < n, coefficient, 0.0)
            inside = np.arange(points) < self.points[b, None]
            below[:, :points] = np.where(inside, np.exp(-rate) * probability, 0.0)
        s = self.suffix[b, prefixes, None]
        grid = self.grid[b]
        integrand = self.weights[b] * s * grid * np.exp(-s * grid) * (1.0 - below)
        for row, target in enumerate(block):
            lo, hi = spans[row], spans[row + 1]
            if hi > lo:
                inclusion[target, prefixes[lo:hi]] = integrand[lo:hi, : self.sizes[row]].sum(axis=1)
