// The units of a large class and their targets (theory/_class_units.py: _units, _unit_targets, _compact,
// _fill_level; theory/optimal_verifier.py: _chain_violations and the repair loop of _fit_class) in C++.
//
// Why: about thirty numpy calls on arrays of a few hundred to a few thousand entries, ~0.6-0.9 ms a build, nearly
// all per-call cost. The Python functions are the specification. The labels can differ from numpy's where numpy's
// SIMD log rounds differently from the C library's (3 in 200,000 values measured) or where equal keys are sorted
// (numpy's default sort is not stable): a unit boundary moves by a token. Exactness never depends on the units
// (each token gets r = q * r_u / Q_u of the race its unit is in); the tests compare the builds' acceptance.
//
// Returns the number of units.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "numerics.h"

namespace {

using specbound::fill_level_of;
using specbound::power_difference;

// Dense labels 0, 1, ... in increasing order of the given labels (theory._class_units._compact). The labels are
// small non-negative integers (or -1) below `range`: ranked by counting where the range is comparable to the
// number of labels, else by sorting the distinct labels (the bin labels of a large class span ~10^5 values for
// a few hundred items: counting zeroed and scanned all of them, ~4% of a build).
int64_t compact(std::vector<int64_t>& labels, int64_t range) {
    if (range > 8 * static_cast<int64_t>(labels.size())) {
        std::vector<int64_t> distinct(labels);
        std::sort(distinct.begin(), distinct.end());
        distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
        for (int64_t& label : labels) label = std::lower_bound(distinct.begin(), distinct.end(), label) - distinct.begin();
        return static_cast<int64_t>(distinct.size());
    }
    std::vector<int64_t> rank(range + 1, 0);
    for (int64_t label : labels) rank[label + 1] = 1;
    int64_t next = 0;
    for (int64_t& slot : rank) {
        int64_t present = slot;
        slot = next;
        next += present;
    }
    for (int64_t& label : labels) label = rank[label + 1];
    return next;
}

struct Class {
    const double *capped, *qs, *ratio;
    int64_t size;
    double mass;
    bool above;
};

// theory._class_units._unit_targets: unit masses and water-filled targets; relabels units at the level.
void unit_targets(const Class& c, std::vector<int64_t>& labels, int64_t& units, std::vector<double>& unit_q,
                  std::vector<double>& unit_target) {
    unit_q.assign(units, 0.0);
    std::vector<double> extreme(units, c.above ? INFINITY : -INFINITY);
    for (int64_t i = 0; i < c.size; ++i) {
        unit_q[labels[i]] += c.qs[i];
        double& e = extreme[labels[i]];
        e = c.above ? std::min(e, c.ratio[i]) : std::max(e, c.ratio[i]);
    }
    double level = fill_level_of(extreme.data(), unit_q.data(), units, c.mass, c.above);
    if (std::isfinite(level)) {
        std::vector<int64_t> relabel(units);
        for (int64_t u = 0; u < units; ++u) {
            bool at_level = c.above ? extreme[u] >= level : extreme[u] <= level;
            relabel[u] = at_level ? -1 : u;
        }
        int64_t merged = compact(relabel, units);
        unit_target.assign(merged, 0.0);
        for (int64_t u = 0; u < units; ++u) {
            double bound = c.above ? std::min(extreme[u], level) : std::max(extreme[u], level);
            unit_target[relabel[u]] += bound * unit_q[u];
        }
        for (int64_t& label : labels) label = relabel[label];
        units = merged;
        unit_q.assign(units, 0.0);
        for (int64_t i = 0; i < c.size; ++i) unit_q[labels[i]] += c.qs[i];
        return;
    }
    // No level reaches the mass: the item-level fill, summed per unit.
    level = fill_level_of(c.ratio, c.qs, c.size, c.mass, c.above);
    unit_target.assign(units, 0.0);
    for (int64_t i = 0; i < c.size; ++i) {
        double filled = level * c.qs[i];
        unit_target[labels[i]] += c.above ? std::min(c.capped[i], filled) : std::max(c.capped[i], filled);
    }
}

// theory.optimal_verifier._chain_violations: units on the chain up to its last prefix outside the race polytope.
std::vector<char> chain_violations(const std::vector<double>& unit_q, std::vector<double> unit_target, double lower,
                                   double mass, int n, bool above) {
    const std::size_t units = unit_q.size();
    double total = specbound::pairwise(unit_target.data(), units);
    for (double& t : unit_target) t = t * (mass / total);
    std::vector<std::size_t> order(units);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return unit_target[a] / unit_q[a] < unit_target[b] / unit_q[b]; });
    if (!above) std::reverse(order.begin(), order.end());
    std::vector<double> rest(units + 1, 0.0);
    for (std::size_t k = units; k-- > 0;) rest[k] = rest[k + 1] + unit_q[order[k]];
    double head_q = 0.0, head_t = 0.0;
    std::size_t last_bad = 0;
    bool any = false;
    for (std::size_t k = 0; k + 1 < units; ++k) {  // the whole class (last prefix) is not a constraint
        head_q += unit_q[order[k]];
        head_t += unit_target[order[k]];
        double deficit = above ? power_difference(lower + head_q, lower, head_q, n) - head_t
                               : head_t - (mass - power_difference(lower + rest[k + 1], lower, rest[k + 1], n));
        if (deficit > 1e-15 * mass) {
            last_bad = k;
            any = true;
        }
    }
    std::vector<char> wrong(units, 0);
    if (any)
        for (std::size_t k = 0; k <= last_bad; ++k) wrong[order[k]] = 1;
    return wrong;
}

}  // namespace

extern "C" int64_t specbound_class_units(const double* capped, const double* qs, const double* ratio,
                                         const double* slack, int64_t size, double mass, int above, double lower,
                                         int n, int bins, double own_unit_mass, int64_t max_own_units, double tight,
                                         int64_t* out_labels, double* out_unit_q, double* out_unit_target) {
    const Class c{capped, qs, ratio, size, mass, above != 0};
    // _units: the heaviest tokens alone, the others by bin of log(p/q) and quarter octave of slack.
    std::vector<int64_t> labels(size, -1), heavy;
    for (int64_t i = 0; i < size; ++i)
        if (std::max(capped[i], qs[i]) >= own_unit_mass) heavy.push_back(i);
    if (static_cast<int64_t>(heavy.size()) > max_own_units) {
        std::stable_sort(heavy.begin(), heavy.end(), [&](int64_t a, int64_t b) {
            return std::max(capped[a], qs[a]) > std::max(capped[b], qs[b]);
        });
        heavy.resize(max_own_units);
    }
    for (std::size_t h = 0; h < heavy.size(); ++h) labels[heavy[h]] = static_cast<int64_t>(h);
    std::vector<double> log_ratio(size);
    double low = INFINITY, high = -INFINITY;
    for (int64_t i = 0; i < size; ++i)
        if (labels[i] < 0) {
            log_ratio[i] = std::log(capped[i] / qs[i]);
            if (std::isfinite(log_ratio[i])) {
                low = std::min(low, log_ratio[i]);
                high = std::max(high, log_ratio[i]);
            }
        }
    if (!(low <= high)) low = high = 0.0;  // no finite ratio among the light tokens
    const double step = (high - low) / bins;  // numpy's linspace: edge j = j * step + low, inner edges only
    std::vector<double> edges(bins > 1 ? bins - 1 : 0);
    for (int j = 1; j < bins; ++j) edges[j - 1] = j * step + low;
    int64_t range = static_cast<int64_t>(heavy.size());
    for (int64_t i = 0; i < size; ++i) {
        if (labels[i] >= 0) continue;
        int64_t bin = 0;
        if (std::isfinite(log_ratio[i]))  // the edges below the value (searchsorted, side="left"), plus one
            bin = std::lower_bound(edges.begin(), edges.end(), log_ratio[i]) - edges.begin() + 1;
        int64_t octave = static_cast<int64_t>(std::floor(4.0 * std::log2(std::max(slack[i], tight) / tight)));
        labels[i] = static_cast<int64_t>(heavy.size()) + bin * 512 + std::min<int64_t>(octave, 511);
        range = std::max(range, labels[i] + 1);
    }
    int64_t units = compact(labels, range);
    std::vector<double> unit_q, unit_target;
    for (int attempt = 0; attempt < 4; ++attempt) {
        unit_targets(c, labels, units, unit_q, unit_target);
        if (attempt == 3) break;
        // Targets outside the race polytope on the chain: every unit of several items up to the last violated
        // prefix is split into its items.
        std::vector<char> wrong = chain_violations(unit_q, unit_target, lower, mass, n, c.above);
        std::vector<int64_t> members(units, 0);
        for (int64_t label : labels) ++members[label];
        bool any = false;
        for (int64_t u = 0; u < units; ++u) any = any || (wrong[u] && members[u] > 1);
        if (!any) break;
        int64_t top = *std::max_element(labels.begin(), labels.end());
        for (int64_t i = 0; i < size; ++i)
            if (wrong[labels[i]] && members[labels[i]] > 1) labels[i] = top + 1 + i;
        units = compact(labels, top + 1 + size);
    }
    std::copy(labels.begin(), labels.end(), out_labels);
    std::copy(unit_q.begin(), unit_q.end(), out_unit_q);
    std::copy(unit_target.begin(), unit_target.end(), out_unit_target);
    return units;
}
