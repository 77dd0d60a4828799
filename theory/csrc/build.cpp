// The build of one row's tables from its items (theory/optimal_verifier.py: _build_items_in_numpy with the first
// unit fit, _fit_class, _fill_view, _item_targets; theory/_class_units.py: _cap_units) in C++.
//
// Why: with the race fit, the buckets and the units native, the numpy code around them (~100 array calls on a
// few hundred items, three passes over the vocabulary for the token marginal and the acceptance) was 0.4-0.6 ms
// of a ~2 ms build. Here it is one call that runs the units and the fit of this library directly. The Python
// functions are the specification and the oracle (tests/theory/test_native.py): the same formulas in the same
// order, with numpy's summation orders (pairwise sums, reduceat's first element plus the pairwise rest, cumulative
// sums left to right, the blocked long double prefix sums). The powers come from the C library where numpy may
// use its own SIMD pow, so the tables match numpy's to round-off, not bitwise; exactness never depends on it (each
// token's r is q r_u / Q_u of its unit's race, whose marginal the fit returns at its own weights).
//
// Returns 0 with the tables written; 1 when 1 - alpha* is below `min_room` (numpy returns None); 2 where numpy
// must build the row instead: a fit the native code refuses, or a first fit short of alpha* by more than the
// retry threshold in a class with units (numpy's retries and the per-item fit are not here).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <vector>

#include "numerics.h"

extern "C" int specbound_race_fit(double lower, const double* masses, const double* target, int units, int n,
                                  double step, double low, double high, double tail_low, double wide, double floor,
                                  double max_step, double tolerance, int max_iterations, int max_halvings,
                                  double* out_log_weights, double* out_r);
extern "C" int64_t specbound_class_units(const double* capped, const double* qs, const double* ratio,
                                         const double* slack, int64_t size, double mass, int above, double lower,
                                         int n, int bins, double own_unit_mass, int64_t max_own_units, double tight,
                                         int64_t* out_labels, double* out_unit_q, double* out_unit_target);
extern "C" int64_t specbound_bucketed(const double* ps, const double* qs, int64_t size, int n, double group_below,
                                      double tight, double margin, const int64_t* absent, int64_t absent_count,
                                      int shift, int coarse_shift, double* item_p, double* item_q, double* item_low,
                                      double* item_high, uint8_t* item_single, int64_t* item_count, int64_t* item);

namespace {

using specbound::fill_level_of;
using specbound::pairwise;
using specbound::power;
using specbound::power_difference;

// The constants, in the order of theory._native.BUILD_CONSTANTS.
struct Constants {
    double tight, retry_shortfall;
    int bins;
    int64_t max_own_units, max_units;
    double unit_own_unit_mass;  // the units' constants (theory.optimal_verifier.UNIT_CONSTANTS)
    int64_t unit_max_own_units;
    double unit_tight;
    double step, low, high, tail_low, wide, floor, max_step, tolerance;
    int max_iterations, max_halvings;
};

// theory._buckets.prefix_sums: [0, v_0, v_0 + v_1, ...], float64 sums inside blocks of 256, the block offsets
// summed in long double (numpy's longdouble: the x87 80-bit type on x86-64 Linux) and rounded once.
std::vector<double> prefix_sums(const double* values, int64_t size) {
    constexpr int64_t block = 256;
    std::vector<double> out(size + 1);
    out[0] = 0.0;
    long double offsets = 0.0L;
    for (int64_t start = 0; start < size; start += block) {
        const double offset = static_cast<double>(offsets);
        double inner = 0.0;
        const int64_t stop = std::min(size, start + block);
        for (int64_t i = start; i < stop; ++i) {
            inner = i == start ? values[i] : inner + values[i];
            out[i + 1] = inner + offset;
        }
        offsets += static_cast<long double>(inner);  // the block's total (its zero padding adds nothing)
    }
    return out;
}

// A large class's units over MAX_UNITS merged along the chain of target ratios (theory._class_units._cap_units).
void cap_units(std::vector<int64_t>& labels, const double* qs, std::vector<double>& unit_q,
               std::vector<double>& unit_target, int64_t cap) {
    const int64_t units = static_cast<int64_t>(unit_q.size());
    if (units <= cap) return;
    std::vector<int64_t> order(units);
    std::iota(order.begin(), order.end(), 0);
    std::vector<double> ratio(units);
    for (int64_t u = 0; u < units; ++u) ratio[u] = unit_target[u] / unit_q[u];
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ratio[a] < ratio[b]; });
    std::vector<double> block_q(units), block_t(units);
    for (int64_t u = 0; u < units; ++u) {
        block_q[u] = unit_q[order[u]];
        block_t[u] = unit_target[order[u]];
    }
    std::vector<int64_t> member(units);
    std::iota(member.begin(), member.end(), 0);
    while (static_cast<int64_t>(block_q.size()) > cap) {
        const int64_t blocks = static_cast<int64_t>(block_q.size());
        std::vector<double> cost(blocks - 1);
        for (int64_t b = 0; b + 1 < blocks; ++b) {
            double joint = block_q[b] + block_q[b + 1];
            double c = block_q[b] * block_q[b + 1] / joint *
                       std::fabs(block_t[b + 1] / block_q[b + 1] - block_t[b] / block_q[b]);
            cost[b] = std::isnan(c) ? INFINITY : c;
        }
        // Local minima (ties broken to the left); of two adjacent ones (a tie), the left one only.
        std::vector<int64_t> candidates;
        int64_t previous = -2;
        for (int64_t b = 0; b + 1 < blocks; ++b) {
            double left = b > 0 ? cost[b - 1] : INFINITY, right = b + 2 < blocks ? cost[b + 1] : INFINITY;
            if (!((cost[b] < left && cost[b] <= right) || (cost[b] <= left && cost[b] < right))) continue;
            if (b - previous > 1) candidates.push_back(b);
            previous = b;
        }
        if (candidates.empty()) candidates.push_back(std::min_element(cost.begin(), cost.end()) - cost.begin());
        std::stable_sort(candidates.begin(), candidates.end(), [&](int64_t a, int64_t b) { return cost[a] < cost[b]; });
        candidates.resize(std::min<int64_t>(candidates.size(), blocks - cap));
        std::vector<int64_t> start(blocks, 1), renumber(blocks);
        start[0] = 0;
        for (int64_t b : candidates) start[b + 1] = 0;
        int64_t next = 0;
        for (int64_t b = 0; b < blocks; ++b) renumber[b] = next += start[b];
        std::vector<double> merged_q(next + 1, 0.0), merged_t(next + 1, 0.0);
        for (int64_t b = 0; b < blocks; ++b) {
            merged_q[renumber[b]] += block_q[b];
            merged_t[renumber[b]] += block_t[b];
        }
        block_q.swap(merged_q);
        block_t.swap(merged_t);
        for (int64_t& m : member) m = renumber[m];
    }
    std::vector<int64_t> merged(units);
    for (int64_t u = 0; u < units; ++u) merged[order[u]] = member[u];
    for (int64_t& label : labels) label = merged[label];
    std::vector<double> capped_q(cap, 0.0), capped_t(cap, 0.0);
    for (std::size_t i = 0; i < labels.size(); ++i) capped_q[labels[i]] += qs[i];
    for (int64_t u = 0; u < units; ++u) capped_t[merged[u]] += unit_target[u];
    unit_q.swap(capped_q);
    unit_target.swap(capped_t);
}

// theory.optimal_verifier._fit_class on the items a:b: their r and log-weights; false where numpy must fit.
bool fit_class(const double* item_p, const double* item_q, const double* item_low, const double* item_high,
               const uint8_t* item_single, const double* slack, int64_t a, int64_t b, double lower, double mass,
               int n, const Constants& c, double* r, double* logs) {
    const int64_t size = b - a;
    const double *ps = item_p + a, *qs = item_q + a;
    const bool above = mass <= pairwise(ps, size);  // _fill_view
    const double* bound = above ? item_low + a : item_high + a;
    std::vector<double> capped(size), ratio(size);
    for (int64_t i = 0; i < size; ++i) {
        capped[i] = item_single[a + i] ? ps[i] : bound[i] * qs[i];
        ratio[i] = item_single[a + i] ? ps[i] / qs[i] : bound[i];
    }
    std::vector<int64_t> labels(size);
    std::vector<double> unit_q, unit_target;
    if (size <= c.max_own_units) {  // _item_targets: every item its own unit, the water-filled target
        std::iota(labels.begin(), labels.end(), 0);
        unit_q.assign(qs, qs + size);
        const double level = fill_level_of(ratio.data(), qs, size, mass, above);
        unit_target.resize(size);
        for (int64_t i = 0; i < size; ++i)
            unit_target[i] = above ? std::min(capped[i], level * qs[i]) : std::max(capped[i], level * qs[i]);
    } else {
        unit_q.resize(size);
        unit_target.resize(size);
        const int64_t units =
            specbound_class_units(capped.data(), qs, ratio.data(), slack + a, size, mass, above, lower, n, c.bins,
                                  c.unit_own_unit_mass, c.unit_max_own_units, c.unit_tight, labels.data(),
                                  unit_q.data(), unit_target.data());
        unit_q.resize(units);
        unit_target.resize(units);
        cap_units(labels, qs, unit_q, unit_target, c.max_units);
    }
    const int64_t units = static_cast<int64_t>(unit_q.size());
    for (double& t : unit_target) t = std::max(t, 1e-300);  // positive targets summing to the class mass
    const double scale = mass / pairwise(unit_target.data(), units);
    for (double& t : unit_target) t *= scale;
    std::vector<double> log_weights(units, 0.0), unit_r(units);
    if (units == 1) {
        unit_r[0] = mass;  // one unit takes the whole class (numpy: the race's marginal, rescaled to the mass)
    } else if (specbound_race_fit(lower, unit_q.data(), unit_target.data(), static_cast<int>(units), n, c.step,
                                  c.low, c.high, c.tail_low, c.wide, c.floor, c.max_step, c.tolerance,
                                  c.max_iterations, c.max_halvings, log_weights.data(), unit_r.data()) != 0) {
        return false;
    }
    const double rescale = mass / pairwise(unit_r.data(), units);  // removes the common-mode quadrature error
    for (double& x : unit_r) x *= rescale;
    for (int64_t i = 0; i < size; ++i) {
        r[i] = qs[i] * (unit_r[labels[i]] / unit_q[labels[i]]);
        logs[i] = log_weights[labels[i]];
    }
    return true;
}

}  // namespace

extern "C" int specbound_build_items(const double* item_p, const double* item_q, const double* item_low,
                                     const double* item_high, const uint8_t* item_single, const int64_t* item_count,
                                     int64_t size, const int64_t* token_item, const double* p_tokens,
                                     const double* q_tokens, int64_t tokens, int n, double min_room,
                                     const double* constants, double* out_r, int64_t* out_class, double* out_logs,
                                     double* out_accepted, double* out_alpha, int64_t* out_minimiser) {
    const double* k = constants;
    const Constants c{k[0],  k[1],  static_cast<int>(k[2]), static_cast<int64_t>(k[3]), static_cast<int64_t>(k[4]),
                      k[5],  static_cast<int64_t>(k[6]), k[7], k[8], k[9], k[10], k[11], k[12], k[13], k[14], k[15],
                      static_cast<int>(k[16]), static_cast<int>(k[17])};
    const std::vector<double> target_mass = prefix_sums(item_p, size);
    std::vector<double> draft_mass = prefix_sums(item_q, size);
    std::vector<double> gap(size + 1);
    double best = INFINITY;
    for (int64_t i = 0; i <= size; ++i) {
        draft_mass[i] = std::min(draft_mass[i], 1.0);
        gap[i] = target_mass[i] - power(draft_mass[i], n);
        best = std::min(best, gap[i]);
    }
    if (-best < min_room) return 1;
    const double alpha = std::clamp(1.0 + best, 0.0, 1.0);
    // Class bounds: 0, every nearly tight prefix, size; the minimiser is the first prefix at the smallest gap.
    std::vector<int64_t> bounds{0};
    int64_t minimiser = -1, count = 0;
    for (int64_t i = 0; i <= size; ++i) {
        if (gap[i] <= best + c.tight) {
            if (i > 0 && i < size) bounds.push_back(i);
            if (minimiser < 0 || gap[i] < gap[minimiser]) minimiser = i;
        }
    }
    bounds.push_back(size);
    for (int64_t i = 0; i < minimiser; ++i) count += item_count[i];
    std::vector<double> slack(size), r_items(size, 0.0);
    for (int64_t i = 0; i < size; ++i) slack[i] = std::min(gap[i], gap[i + 1]) - best;
    std::fill(out_logs, out_logs + size, 0.0);
    for (std::size_t index = 0; index + 1 < bounds.size(); ++index) {
        const int64_t a = bounds[index], b = bounds[index + 1];
        const double low_mass = draft_mass[a], high_mass = draft_mass[b];
        // np.add.reduceat: the first item plus the pairwise sum of the rest.
        const double class_q = b - a > 1 ? item_q[a] + pairwise(item_q + a + 1, b - a - 1) : item_q[a];
        const double selected = power_difference(high_mass, low_mass, class_q, n);
        std::fill(out_class + a, out_class + b, static_cast<int64_t>(index));
        if (b - a == 1 && item_single[a]) {
            r_items[a] = selected;
        } else if (!fit_class(item_p, item_q, item_low, item_high, item_single, slack.data(), a, b, low_mass,
                              selected, n, c, r_items.data() + a, out_logs + a)) {
            return 2;
        }
    }
    // r_y = q_y r_i / q_i (a group's tokens share its selection in proportion to q; item `size`: absent tokens).
    std::vector<double> scale(size + 1, 0.0);
    for (int64_t i = 0; i < size; ++i) scale[i] = r_items[i] / item_q[i];
    static thread_local std::vector<double> smaller;
    smaller.resize(tokens);
    for (int64_t t = 0; t < tokens; ++t) {
        out_r[t] = scale[token_item[t]] * q_tokens[t];
        smaller[t] = std::min(p_tokens[t], out_r[t]);
    }
    const double accepted = pairwise(smaller.data(), tokens);
    if (alpha - accepted > c.retry_shortfall && size > c.max_own_units) return 2;  // numpy retries finer units
    *out_accepted = accepted;
    *out_alpha = alpha;
    *out_minimiser = count;
    return 0;
}

// The grouped build of a whole row (theory/optimal_verifier.py: _build_row with group_below > 0): the draft's
// support, the row cut to it or its absent tokens listed, the buckets, the build of the items, and the marginal
// and token-to-item map of the whole vocabulary, in one call. Why: around the two native calls the numpy code
// (support, gathers, fresh arrays, scatters, the calls' own set-up) was ~0.3 ms of a ~1.3 ms build on the logged
// pairs of the trained head. The same functions run on the same arrays, so the tables are bitwise those of the
// two calls. `row` holds NEGLIGIBLE_Q, CUT_SUPPORT_BELOW, GROUPED_MIN_ROOM, TIGHT and the buckets' MARGIN,
// SHIFT and coarse shift; `constants` those of specbound_build_items. Returns the number of items of the tables
// (the last one, class -1 and log-weight 0, holds the absent tokens of a row whose draft leaves some out), or
// -1 where Python builds the row: buckets refused, 1 - alpha* below the room, a fit refused or short of alpha*.
extern "C" int64_t specbound_build_row(const double* p, const double* q, int64_t vocab, int n, double group_below,
                                       const double* row, const double* constants, double* out_r,
                                       int64_t* out_item, int64_t* out_class, double* out_logs,
                                       double* out_scalars, int64_t* out_minimiser) {
    const double negligible_q = row[0], cut_below = row[1], min_room = row[2], tight = row[3], margin = row[4];
    const int shift = static_cast<int>(row[5]), coarse_shift = static_cast<int>(row[6]);
    int64_t support = 0;
    for (int64_t i = 0; i < vocab; ++i) support += q[i] >= negligible_q;
    const bool full = support == vocab;
    const bool cut = !full && static_cast<double>(support) < cut_below * static_cast<double>(vocab);
    // Per-thread scratch: a fresh vocabulary-sized array costs page faults on first touch.
    static thread_local std::vector<double> cut_p, cut_q, cut_r, item_p, item_q, item_low, item_high;
    static thread_local std::vector<int64_t> kept, cut_item, absent, item_count;
    static thread_local std::vector<uint8_t> item_single;
    const double *ps = p, *qs = q;
    int64_t size = vocab, absent_count = 0;
    int64_t* token_item = out_item;
    double* r = out_r;
    if (cut) {  // the support alone, in token order
        // Written for every token and kept by advancing (one slot past the support): no branch to mispredict
        // on a draft vocabulary scattered over the target's.
        for (auto* v : {&cut_p, &cut_q, &cut_r}) v->resize(support + 1);
        kept.resize(support + 1);
        cut_item.resize(support);
        for (int64_t i = 0, k = 0; i < vocab; ++i) {
            kept[k] = i;
            cut_p[k] = p[i];
            cut_q[k] = q[i];
            k += q[i] >= negligible_q;
        }
        ps = cut_p.data();
        qs = cut_q.data();
        size = support;
        token_item = cut_item.data();
        r = cut_r.data();
    } else if (!full) {  // the whole row, its absent tokens rekeyed by the buckets
        absent.resize(vocab - support + 1);
        for (int64_t i = 0; i < vocab; ++i) {
            absent[absent_count] = i;
            absent_count += q[i] < negligible_q;
        }
    }
    for (auto* v : {&item_p, &item_q, &item_low, &item_high}) v->resize(size);
    item_single.resize(size);
    item_count.resize(size);
    const int64_t items =
        specbound_bucketed(ps, qs, size, n, group_below, tight, margin, absent.data(), absent_count, shift,
                           coarse_shift, item_p.data(), item_q.data(), item_low.data(), item_high.data(),
                           item_single.data(), item_count.data(), token_item);
    if (items < 0) return -1;
    double accepted = 0.0, alpha = 0.0;
    int64_t minimiser = 0;
    const int status = specbound_build_items(item_p.data(), item_q.data(), item_low.data(), item_high.data(),
                                             item_single.data(), item_count.data(), items, token_item, ps, qs,
                                             size, n, min_room, constants, r, out_class, out_logs, &accepted,
                                             &alpha, &minimiser);
    if (status != 0 || alpha - accepted > constants[1]) return -1;  // constants[1]: RETRY_SHORTFALL
    if (cut) {
        std::fill(out_r, out_r + vocab, 0.0);
        std::fill(out_item, out_item + vocab, items);
        for (int64_t k = 0; k < support; ++k) {
            out_r[kept[k]] = cut_r[k];
            out_item[kept[k]] = cut_item[k];
        }
    }
    out_scalars[0] = accepted;
    out_scalars[1] = alpha;
    *out_minimiser = minimiser;
    if (full) return items;
    out_class[items] = -1;
    out_logs[items] = 0.0;
    return items + 1;
}
