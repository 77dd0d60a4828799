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
    """:class:`theory._wor._PrefixInclusion` of several rows, padded, for all of each row's needed prefixes.

    Rows are reordered by how much of the quadrature they need: rows with small-clock tokens (the moment series
    and Newton's identities), rows whose every token is in the prefix recursion but which hold Poisson dust
    (the small-clock factor is the dust's Poisson sums alone), and rows with neither (the small-clock factor is
    1, so :math:`P(N < n)` is a sum of the recursion's :math:`e_j`). The last two skip arithmetic whose result
    is exact zeros in the one-row version; every value is still that version's.
    """

    def __init__(self, q, suffix, n, needed, dust):
        rows, width = q.shape
        self.n = n
        threshold = _wor._sure_threshold(n, width)
        reads_before = np.concatenate([np.zeros((rows, 1), np.int64), np.cumsum(needed, axis=1)], axis=1)
        # the last read of each row: its q is cut there, as in the one-row version
        ends = (width - np.argmax(needed[:, ::-1], axis=1)).astype(np.int64)
        firsts = np.argmax(needed, axis=1)
        grid, weights, sizes = _grids(n, np.where(needed, suffix, np.inf).min(axis=1))
        size = grid.shape[1]
        tokens = int(ends.max())
        q = np.where(np.arange(tokens) < ends[:, None], q[:, :tokens], 0.0)

        # Grid points beyond theta / (n-th largest q before the first read): every read has n sure tokens there.
        usable = sizes.copy()  # rows whose first read has fewer than n tokens (dust): the whole grid
        late = firsts >= n
        if late.any():
            before = np.where(np.arange(tokens) < firsts[late, None], q[late], -np.inf)
            nth_largest = -np.sort(-before, axis=1)[:, n - 1]
            # the grid increases, so searchsorted(..., "right") of the one-row version is a count
            within = np.arange(size) < sizes[late, None]
            usable[late] = np.count_nonzero((grid[late] * nth_largest[:, None] <= threshold) & within, axis=1)
        # The index of the n-th token sure by each usable point. A token not sure at a row's last usable point
        # is sure at none before it, so counting the tokens "capable" in any row counts the one-row version's.
        columns = int(usable.max())
        last_usable = grid[np.arange(rows), np.maximum(usable - 1, 0)]
        capable = np.flatnonzero(np.any(q * last_usable[:, None] > threshold, axis=0))
        nth_sure = np.full((rows, size), -1)
        nth_sure[:, :columns] = ends[:, None]
        if capable.size:
            sure_count = np.cumsum(q[:, None, capable] * grid[:, :columns, None] > threshold, axis=2)
            reaches = sure_count[:, :, -1] >= n
            first_n = capable[np.argmax(sure_count >= n, axis=2)]
            nth_sure[:, :columns] = np.where(reaches, first_n, ends[:, None])
        nth_sure[np.arange(size) >= usable[:, None]] = -1
        latest = np.take_along_axis(reads_before, nth_sure + 1, axis=1) - 1  # largest read k <= n-th sure
        read_index = np.zeros((rows, int(reads_before[:, -1].max())), dtype=np.int64)
        read_rows, read_prefixes = np.nonzero(needed)
        read_index[read_rows, reads_before[read_rows, read_prefixes]] = read_prefixes
        smallest = np.take_along_axis(suffix, np.take_along_axis(read_index, np.maximum(latest, 0), 1), 1)
        alive = (latest >= 0) & (smallest * grid <= math.log(1.0 / _wor.TRUNCATION_ERROR))
        alive &= np.arange(size) < sizes[:, None]
        if np.any(dust > 0):
            alive &= ~((dust[:, None] > 0) & (dust[:, None] * grid > _wor._dust_sure_rate(n)))
        points = np.where(alive.any(axis=1), size - np.argmax(alive[:, ::-1], axis=1), 0)
        used = int(points.max())
        t = np.where(np.arange(used) < points[:, None], grid[:, :used], 0.0)
        scale = np.where(points > 0, t[np.arange(rows), np.maximum(points - 1, 0)], 1.0)

        # Rows by kind: small-clock tokens (series) first, then dust only, then neither.
        large = q * scale[:, None] > _wor.SMALL_CLOCK
        small = np.where(large, 0.0, q) * scale[:, None]
        series = np.any(small != 0.0, axis=1)
        kind = np.where(series, 0, np.where(dust > 0, 1, 2))
        order = np.argsort(kind, kind="stable")
        self.series_rows, self.dust_rows = int(np.count_nonzero(series)), int(np.count_nonzero(kind == 1))
        self.order, self.needed, self.suffix, self.dust = order, needed[order], suffix[order], dust[order]
        self.grid, self.weights, self.sizes, self.points = (
            grid[order],
            weights[order],
            sizes[order],
            points[order],
        )
        self.t, self.scale = t[order], scale[order]
        q, large, small = q[order], large[order], small[order]

        # Large-clock tokens, moved to the front of each row in token order: the prefix recursion, one step along
        # the tokens for every row and grid point at once, keeping the state at each needed prefix only.
        large_before = np.concatenate([np.zeros((rows, 1), np.int64), np.cumsum(large, axis=1)], 1)
        count = int(large_before[:, -1].max())
        token_order = np.argsort(~large, axis=1, kind="stable")[:, :count]
        large_q = np.where(
            np.arange(count) < large_before[:, -1:], np.take_along_axis(q, token_order, 1), 0.0
        )
        self.reads = np.nonzero(self.needed)  # by row, so by kind
        self._recursion(large_q, large_before[self.reads], threshold)

        # Small-clock tokens (series rows only): prefix sums of (q scale)^r and the series in t / scale.
        coefficients = _wor._series_coefficients(n)
        orders = coefficients.shape[1] - 1
        some = self.series_rows
        small = small[:some]
        powers = np.empty((some, orders, tokens))
        powers[:, 0] = small
        for r in range(1, orders):
            np.multiply(powers[:, r - 1], small, out=powers[:, r])
        self.moments = np.zeros((some, orders, tokens + 1))
        np.cumsum(powers, axis=2, out=self.moments[:, :, 1:])
        # (t / scale)^r on each row's own points only, then per row (n - 1, R, M'_b), contiguous like the one-row
        # version's: the power sums are its matrix products
        inside = np.arange(self.t.shape[1]) < self.points[:some, None]
        ratio_powers = (self.t[:some] / self.scale[:some, None])[inside][None, :] ** np.arange(1, orders + 1)[
            :, None
        ]
        ends = np.cumsum(self.points[:some])
        self.series = [
            coefficients[1:, 1:, None] * ratio_powers[:, end - width : end]
            for end, width in zip(ends.tolist(), self.points[:some].tolist(), strict=True)
        ]

    def fill(self, inclusion, block) -> None:
        n = self.n
        b, prefixes = self.reads
        points = self.t.shape[1]
        spans = np.concatenate([[0], np.cumsum(np.count_nonzero(self.needed, axis=1))])
        with_series, with_dust = spans[self.series_rows], spans[self.series_rows + self.dust_rows]
        below = np.zeros((b.size, self.grid.shape[1]))
        if points:
            t = self.t[b]
            large_sums, count, unsure = self.large_sums, self.sure_count, self.unsure_mass
            # lambda of the non-sure tokens: the small-clock mass is the first moment (0 outside series rows)
            rate = t * unsure
            head = slice(0, with_series)
            first = self.moments[b[head], 0, prefixes[head]] / self.scale[b[head]]
            rate[head] = t[head] * (first[:, None] + unsure[head])
            dusty = slice(0, with_dust)
            dust_rate = self.dust[b[dusty], None] * t[dusty]
            dusty_rows = self.dust[b[dusty]] > 0
            rate[dusty] = np.where(dusty_rows[:, None], rate[dusty] + dust_rate, rate[dusty])
            small_sums = self._small_sums(
                b[dusty], prefixes[dusty], spans, dust_rate, dusty_rows, with_series
            )
            # P(N < n) = sum of the e_j with j + (sure tokens) < n, e_j = sum_i (large e_i)(small e_{j-i}); each sum
            # in the one-row version's order (its leading 0 + included), a False term adding nothing
            probability = np.zeros_like(rate)
            part, term = np.empty((with_dust, points)), np.empty((with_dust, points))
            plain = slice(with_dust, None)
            for j in range(n):
                use = count < n - j
                np.add(probability[plain], large_sums[plain, j], out=probability[plain], where=use[plain])
                if with_dust:
                    np.multiply(large_sums[dusty, 0], small_sums[j], out=part)
                    part += 0.0
                    for i in range(1, j + 1):
                        part += np.multiply(large_sums[dusty, i], small_sums[j - i], out=term)
                    np.add(probability[dusty], part, out=probability[dusty], where=use[dusty])
            inside = np.arange(points) < self.points[b, None]
            below[:, :points] = np.where(inside, np.exp(-rate) * probability, 0.0)
        s = self.suffix[b, prefixes, None]
        grid = self.grid[b]
        integrand = self.weights[b] * s * grid * np.exp(-s * grid) * (1.0 - below)
        for row, target in enumerate(block[self.order]):
            lo, hi = spans[row], spans[row + 1]
            if hi > lo:
                inclusion[target, prefixes[lo:hi]] = integrand[lo:hi, : self.sizes[row]].sum(axis=1)

    def _recursion(self, large_q, index, threshold) -> None:
        r"""The states of the prefix recursion over the large-clock tokens ``large_q`` (B, J) at the needed
        prefixes, which follow ``index`` of them: :math:`e_j` (P, n, M'), the count of sure tokens and the mass of
        the others.

        :math:`e_j(i + 1) = e_j(i) + w_i e_{j-1}(i)` for all ``j`` at once is the one-row version's cumulative sum
        along the tokens, and so are the count and the mass, in the same order of additions.
        """
        n, t = self.n, self.t
        rows, used = t.shape
        by_index = np.argsort(index, kind="stable")
        bounds = np.searchsorted(index[by_index], np.arange(large_q.shape[1] + 2))
        owner = self.reads[0]
        self.large_sums = np.empty((index.size, n, used))
        self.sure_count = np.empty((index.size, used), dtype=np.int64)
        self.unsure_mass = np.empty((index.size, used))
        state, following = np.zeros((rows, n, used)), np.empty((rows, n, used))
        state[:, 0] = following[:, 0] = 1.0
        sure_count, unsure_mass = np.zeros((rows, used), dtype=np.int64), np.zeros((rows, used))
        with np.errstate(over="ignore"):  # expm1 of a sure token's clock (set to 0 below)
            for i in range(large_q.shape[1] + 1):
                at = by_index[bounds[i] : bounds[i + 1]]  # the prefixes after exactly i large-clock tokens
                if at.size:
                    self.large_sums[at] = state[owner[at]]
                    self.sure_count[at] = sure_count[owner[at]]
                    self.unsure_mass[at] = unsure_mass[owner[at]]
                if i == large_q.shape[1] or bounds[i + 1] == index.size:
                    break
                clock = large_q[:, i, None] * t  # (B, M')
                sure = clock > threshold
                spread = np.expm1(clock, out=clock)
                spread[sure] = 0.0
                np.multiply(spread[:, None], state[:, :-1], out=following[:, 1:])
                np.add(state[:, 1:], following[:, 1:], out=following[:, 1:])
                state, following = following, state
                np.add(unsure_mass, large_q[:, i, None], out=unsure_mass, where=~sure)  # (+ 0 where sure)
                sure_count += sure

    def _small_sums(self, b, prefixes, spans, dust_rate, dusty_rows, with_series):
        """:math:`e_0..e_{n-1}` of the small-clock tokens and the dust, by Newton's identities, on the prefixes of
        the series rows (the first ``with_series``) and the dust rows (``b``, ``prefixes``; the dust's Poisson
        rate ``r t`` per prefix). Outside the series rows only :math:`p_1 = r t` is not 0, and the terms of the
        higher power sums (exact zeros there) are left out."""
        n, points = self.n, dust_rate.shape[1]
        power_sums = [np.zeros((with_series, points)) for _ in range(n - 1)]
        # p_1..p_{n-1}: per row, the one-row version's matrix product on its shapes (rounding of BLAS).
        for row in range(self.series_rows):
            lo, hi, width = spans[row], spans[row + 1], self.points[row]
            if hi == lo or width == 0:
                continue
            row_moments = self.moments[row][:, prefixes[lo:hi]].T
            for m in range(n - 1):
                power_sums[m][lo:hi, :width] = row_moments @ self.series[row][m]
        # the Poisson dust: p_1 gains r t, the higher power sums nothing
        first = np.zeros((b.size, points))
        first[:with_series] = power_sums[0]
        first = np.where(dusty_rows[:, None], first + dust_rate, first)
        # Newton's identities j e_j = sum_{i=1..j} (-1)^(i-1) e_{j-i} p_i, summed in the one-row version's order
        small_sums, term = [np.ones_like(first)], np.empty((with_series, points))
        for j in range(1, n):
            total = np.multiply(small_sums[j - 1], first)
            total += 0.0
            head = total[:with_series]
            for i in range(2, j + 1):
                np.multiply(small_sums[j - i][:with_series], power_sums[i - 1], out=term)
                if i % 2:
                    head += term
                else:
                    head -= term
            total /= j
            small_sums.append(total)
        return small_sums


def _grids(n: int, smallest_complement: np.ndarray):
    """:func:`theory._wor._log_grid` of every row (its points, weights and length), padded with ``t = 1`` and
    weight 0; the same scalar steps per row, then one vectorised pass."""
    u_low = math.log((math.factorial(n + 1) * _wor.TRUNCATION_ERROR) ** (1.0 / (n + 1)))
    sizes, steps = np.empty(smallest_complement.size, dtype=np.int64), np.empty(smallest_complement.size)
    for b, smallest in enumerate(smallest_complement.tolist()):
        u_high = math.log(math.log(1.0 / _wor.TRUNCATION_ERROR) / max(smallest, _wor.SMALLEST_COMPLEMENT))
        points = math.ceil((u_high - u_low) / _wor.QUADRATURE_STEP) + 1
        sizes[b], steps[b] = points, (u_high - u_low) / (points - 1)
    inside = np.arange(int(sizes.max())) < sizes[:, None]
    grid = np.where(inside, np.exp(u_low + steps[:, None] * np.arange(int(sizes.max()))), 1.0)
    weights = np.where(inside, steps[:, None], 0.0)
    weights[:, 0] *= 0.5
    longer = np.flatnonzero(sizes > 1)  # (a one-point grid is halved once, as weights[[0, -1]] *= 0.5 does)
    weights[longer, sizes[longer] - 1] *= 0.5
    return grid, weights, sizes
