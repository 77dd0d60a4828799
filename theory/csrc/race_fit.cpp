// The race fit of theory/_race.py (fit_log_weights: newton_fit on race_marginal / race_potential) in C++.
//
// Why: a class of the optimal verifier's build has ~35 units and ~100 quadrature nodes, so one numpy evaluation of
// the race marginal and its Jacobian (~20 array operations on 3,500 numbers) costs ~100 us, almost all of it the
// per-call cost of numpy; the Newton loop around it (a 35 x 35 solve, clips, norms) as much again. Here the same
// arithmetic runs in one call. The Python module is the specification and the oracle (tests/theory/
// test_native.py): every formula below is the one of the function it names there, and the marginal returned
// is the one evaluated at the returned log-weights, which is all losslessness needs. Plain C ABI (ctypes), no
// fast-math: IEEE double throughout, so values differ from numpy's by round-off only (the exp is within 1 ulp
// of the C library's, as numpy's own is; sums over the nodes run in numpy's pairwise order). The tables are
// node-major, units along the rows, so that every pass runs on eight units at a time.
//
// Return codes of specbound_race_fit: 0 done; 1 a case the Python fit handles (a singular Newton system, a node
// window past WIDE); the caller then runs the numpy fit.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "numerics.h"

namespace {

using specbound::pairwise;
using specbound::power;
using specbound::power_difference;

// Eight doubles in one vector (GCC/Clang extension): one AVX-512 register, two AVX ones.
typedef double Eight __attribute__((vector_size(64)));
typedef std::int64_t EightInt __attribute__((vector_size(64)));
constexpr int LANES = 8;

Eight load(const double* a) {
    Eight v;
    std::memcpy(&v, a, sizeof v);
    return v;
}

void store(double* a, Eight v) { std::memcpy(a, &v, sizeof v); }

// e^x on eight lanes, within 1 ulp of the C library's exp (tests/theory/test_native.py checks it on 10^6
// arguments, subnormal results, overflow, infinities and NaN included). Why: the race's ~U K clocks per
// evaluation each need one, and glibc's exp is scalar (6-10 ns a call here, a tenth of a build). x = k ln 2 + r
// with |r| <= ln 2 / 2 (k rounded by the 1.5 * 2^52 shifter, ln 2 in two parts, Cody and Waite), e^r by its
// Taylor polynomial to degree 13 (truncation below 5e-18), and 2^k as two normal factors 2^(k/2) 2^(k - k/2), so
// a subnormal result is rounded once. Contraction into FMAs is allowed here (only here): it makes the
// polynomial faster and no less accurate.
__attribute__((optimize("fp-contract=fast"))) Eight exp8(Eight x) {
    const double shifter = 6755399441055744.0, log2e = 1.4426950408889634;
    const double ln2_high = 0x1.62e42fefa3800p-1, ln2_low = 0x1.ef35793c76730p-45;
    x = x < -746.0 ? -746.0 : x;  // e^x rounds to 0 below, to +inf above; NaN fails both tests and stays NaN
    x = x > 710.0 ? 710.0 : x;
    const Eight shifted = x * log2e + shifter;
    const Eight k = shifted - shifter;
    const Eight r = (x - k * ln2_high) - k * ln2_low;
    Eight poly = r * (1.0 / 6227020800.0) + 1.0 / 479001600.0;
    for (double coefficient : {1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0,
                               1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5})
        poly = poly * r + coefficient;
    const Eight near_one = 1.0 + (r + (r * r) * poly);
    EightInt whole;  // k itself: the low bits of the shifted sum
    std::memcpy(&whole, &shifted, sizeof whole);
    std::int64_t shifter_bits;
    std::memcpy(&shifter_bits, &shifter, sizeof shifter_bits);
    whole -= shifter_bits;
    const EightInt half = whole >> 1;
    const EightInt first_bits = (half + 1023) << 52, second_bits = (whole - half + 1023) << 52;
    Eight first, second;
    std::memcpy(&first, &first_bits, sizeof first);
    std::memcpy(&second, &second_bits, sizeof second);
    return (near_one * first) * second;
}

// numpy's pairwise sum (numerics.h) down each of the eight columns a[row * stride + lane]: the same additions in
// the same order per column, so a sum over the nodes in the node-major layout below is the one of a contiguous
// (U, K) row.
Eight pairwise_columns(const double* a, std::size_t rows, std::size_t stride) {
    if (rows < 8) {
        Eight sum = {};
        for (std::size_t i = 0; i < rows; ++i) sum += load(a + i * stride);
        return sum;
    }
    if (rows <= 128) {
        Eight r[8];
        for (int j = 0; j < 8; ++j) r[j] = load(a + j * stride);
        std::size_t i = 8;
        for (; i + 8 <= rows; i += 8)
            for (int j = 0; j < 8; ++j) r[j] += load(a + (i + j) * stride);
        Eight sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < rows; ++i) sum += load(a + i * stride);
        return sum;
    }
    std::size_t half = rows / 2;
    half -= half % 8;
    return pairwise_columns(a, half, stride) + pairwise_columns(a + half * stride, rows - half, stride);
}

double lane_sum(Eight v) {
    double sum = 0.0;
    for (int j = 0; j < LANES; ++j) sum += v[j];
    return sum;
}

// hessian_uv -= factor sum_k scaled_ku weighted_scaled_kv (node-major tables of stride S, zero-padded), the
// race's cross term n (n - 1) h sum_k scaled_uk power_k scaled_vk. Symmetric: for 8 rows u at a time, the blocks
// of 8 columns v from the diagonal's on, each summed over the nodes in eight registers (one load, eight
// broadcasts and eight FMAs per node), then mirrored. Only the Newton direction depends on these entries (the
// marginal does not), so contraction into FMAs is allowed here.
__attribute__((optimize("fp-contract=fast"))) void subtract_cross(const double* scaled, const double* weighted_scaled,
                                                                  int U, int K, int S, double factor, double* hessian) {
    for (int u0 = 0; u0 < U; u0 += LANES) {
        for (int v0 = u0; v0 < U; v0 += LANES) {
            Eight sum[LANES] = {};
            for (int k = 0; k < K; ++k) {
                const Eight block = load(scaled + static_cast<std::size_t>(k) * S + v0);
                const double* rows = weighted_scaled + static_cast<std::size_t>(k) * S + u0;
                for (int i = 0; i < LANES; ++i) sum[i] += rows[i] * block;
            }
            for (int u = u0; u < std::min(U, u0 + LANES); ++u)
                for (int v = std::max(u, v0); v < std::min(U, v0 + LANES); ++v) {
                    const double term = factor * sum[u - u0][v - v0];
                    hessian[static_cast<std::size_t>(u) * U + v] -= term;
                    if (v != u) hessian[static_cast<std::size_t>(v) * U + u] -= term;
                }
        }
    }
}

struct Constants {
    double step, low, high, tail_low, wide, floor, max_step, tolerance;
    int max_iterations, max_halvings;
};

double max_of(const std::vector<double>& x) { return *std::max_element(x.begin(), x.end()); }

struct Race {
    double lower;
    const double* masses;
    int units, n;
    Constants c;
    // Scratch, reused across evaluations: (K, stride) node-major tables, units along the rows padded to a
    // multiple of eight with zero masses and weights (zero density: the padding adds nothing to any sum).
    std::vector<double> padded_masses, weights, nodes_t, clock, density, weighted, slope, scaled, weighted_scaled, phi, power_k;
    // The last evaluation's cross term, not yet subtracted (finish_hessian): the last evaluation of a fit and every
    // rejected trial never need it, and it is the O(U^2 K) part of an evaluation.
    int pending_nodes = 0;

    // Quadrature nodes s = ln t from `low` (shifted by the largest log-weight) past HIGH - min(log-weights).
    int nodes(const std::vector<double>& lw, double low, double& first) const {
        double lo = low - max_of(lw);
        double hi = c.high - *std::min_element(lw.begin(), lw.end());
        first = lo;
        return static_cast<int>(std::ceil((hi - lo) / c.step)) + 1;
    }

    int stride() const { return (units + LANES - 1) / LANES * LANES; }

    // The weights e^lw and masses padded to the stride, and the nodes t_k = e^(s0 + h k).
    void prepare(const std::vector<double>& lw, double s0, int K) {
        const int S = stride();
        padded_masses.assign(S, 0.0);
        std::copy(masses, masses + units, padded_masses.begin());
        weights.assign(S, 0.0);
        for (int u = 0; u < units; ++u) weights[u] = std::exp(lw[u]);
        nodes_t.resize(K);
        for (int k = 0; k < K; ++k) nodes_t[k] = std::exp(s0 + c.step * k);
    }

    // phi(t_k) - x = sum_u Q_u e^(-w_u t_k) for each node, the clocks w_u t_k and their survival e^(-w_u t_k)
    // stored in `clock` and `density` (node-major) where asked.
    double survival_sum(int k, double* clock_row, double* survive_row) {
        const int S = stride();
        Eight sum = {};
        for (int b = 0; b < S; b += LANES) {
            const Eight cl = load(&weights[b]) * nodes_t[k];
            const Eight sv = exp8(-cl);
            if (clock_row != nullptr) {
                store(clock_row + b, cl);
                store(survive_row + b, sv);
            }
            sum += load(&padded_masses[b]) * sv;
        }
        return lane_sum(sum);
    }

    // theory._race.race_marginal (jacobian=True: the diagonal here, the cross term in finish_hessian); false where
    // the window passes WIDE (the log-space clocks).
    bool marginal(std::vector<double> lw, std::vector<double>& r, std::vector<double>& hessian) {
        const int U = units;
        r.assign(U, 0.0);
        hessian.assign(static_cast<std::size_t>(U) * U, 0.0);
        pending_nodes = 0;
        if (n == 2) return bradley_terry(lw, r, hessian);
        double top = max_of(lw);
        for (double& x : lw) x -= top;
        double s0;
        const int K = nodes(lw, c.tail_low, s0);
        if (s0 + c.step * (K - 1) > c.wide) return false;
        prepare(lw, s0, K);
        const int S = stride();
        const std::size_t cells = static_cast<std::size_t>(K) * S;
        clock.resize(cells);
        density.resize(cells);
        weighted.resize(cells);
        slope.resize(cells);
        scaled.resize(cells);
        weighted_scaled.resize(cells);
        phi.resize(K);
        power_k.resize(K);
        for (int k = 0; k < K; ++k) {
            phi[k] = lower + survival_sum(k, &clock[static_cast<std::size_t>(k) * S], &density[static_cast<std::size_t>(k) * S]);
            power_k[k] = power(phi[k], n - 2);
        }
        // Local pointers: stores through double* would otherwise make GCC reload the vectors' data pointers.
        const double *cl_table = clock.data(), *sv_table = density.data(), *mass = padded_masses.data();
        double *wt_table = weighted.data(), *slope_table = slope.data(), *sc_table = scaled.data(), *ws_table = weighted_scaled.data();
        for (int k = 0; k < K; ++k) {
            const double top_power = power_k[k] * phi[k], node_power = power_k[k];
            const std::size_t row = static_cast<std::size_t>(k) * S;
            for (int b = 0; b < S; b += LANES) {
                const Eight cl = load(cl_table + row + b);
                const Eight dens = cl * load(sv_table + row + b);  // w t e^(-w t)
                const Eight wt = dens * top_power;
                const Eight sc = dens * load(mass + b);
                store(wt_table + row + b, wt);
                store(slope_table + row + b, (1.0 - cl) * wt);
                store(sc_table + row + b, sc);
                store(ws_table + row + b, sc * node_power);
            }
        }
        // Lower tail (theory._race._lower_tail), to second order in t.
        double mass_total = pairwise(masses, U);
        double weighted_sum = 0.0;
        for (int u = 0; u < U; ++u) weighted_sum += masses[u] * weights[u];
        double total = lower + mass_total;
        double tail_power = power(total, n - 2);
        double start = nodes_t[0];
        for (int b = 0; b < S; b += LANES) {
            const Eight weighted_nodes = pairwise_columns(&weighted[b], K, S);
            const Eight slope_nodes = pairwise_columns(&slope[b], K, S);
            for (int u = b; u < std::min(U, b + LANES); ++u) {
                const double w = weights[u];
                double linear = c.step * start / std::expm1(c.step) * (tail_power * total) * w;
                double drift = w * (tail_power * total) + (n - 1) * tail_power * weighted_sum;
                double quadratic = c.step * start * start / std::expm1(2.0 * c.step) * w * drift;
                double nq = n * masses[u];
                r[u] = nq * (c.step * weighted_nodes[u - b] + (linear - quadratic));
                hessian[static_cast<std::size_t>(u) * U + u] = nq * (c.step * slope_nodes[u - b] + linear);
            }
        }
        pending_nodes = K;  // the cross term waits for finish_hessian
        return true;
    }

    // Subtracts the cross term of the last marginal evaluation from its `hessian` (a no-op for n = 2, whose
    // Hessian is complete). Only the latest evaluation's tables are kept, so call it before evaluating again.
    void finish_hessian(std::vector<double>& hessian) {
        if (pending_nodes == 0) return;
        subtract_cross(scaled.data(), weighted_scaled.data(), units, pending_nodes, stride(), n * (n - 1) * c.step, hessian.data());
        pending_nodes = 0;
    }

    bool bradley_terry(const std::vector<double>& lw, std::vector<double>& r, std::vector<double>& hessian) {
        const int U = units;
        std::vector<double> win(static_cast<std::size_t>(U) * U);
        for (int u = 0; u < U; ++u)
            for (int v = 0; v < U; ++v) win[static_cast<std::size_t>(u) * U + v] = 1.0 / (std::exp(lw[v] - lw[u]) + 1.0);
        for (int u = 0; u < U; ++u) {
            double sum = 0.0;
            double rowsum = 0.0;
            for (int v = 0; v < U; ++v) {
                double wuv = win[static_cast<std::size_t>(u) * U + v];
                sum += wuv * masses[v];
                if (v != u) {
                    double cross = 2.0 * masses[u] * masses[v] * (wuv * win[static_cast<std::size_t>(v) * U + u]);
                    hessian[static_cast<std::size_t>(u) * U + v] = -cross;
                    rowsum += cross;
                }
            }
            r[u] = 2.0 * masses[u] * (lower + sum);
            hessian[static_cast<std::size_t>(u) * U + u] = rowsum;
        }
        return true;
    }

    // theory._race.race_potential: E[log sum w(X_i); C on top]; false where the window passes WIDE.
    bool potential(const std::vector<double>& lw, double& out) {
        const int U = units;
        if (n == 2) {
            double value = 0.0, linear = 0.0;
            for (int u = 0; u < U; ++u) {
                double inner = 0.0;
                for (int v = 0; v < U; ++v) {
                    double a = lw[u], b = lw[v], pair;
                    if (a == b) pair = a + M_LN2;
                    else if (a > b) pair = a + std::log1p(std::exp(b - a));
                    else pair = b + std::log1p(std::exp(a - b));
                    inner += masses[v] * pair;
                }
                value += masses[u] * inner;
                linear += masses[u] * lw[u];
            }
            out = value + 2.0 * lower * linear;
            return true;
        }
        double top = max_of(lw);
        std::vector<double> shifted(U + 1);
        for (int u = 0; u < U; ++u) shifted[u] = lw[u] - top;
        shifted[U] = 0.0;  // the reference clock t of the e^-t term
        double s0;
        const int K = nodes(shifted, c.low, s0);
        if (s0 + c.step * (K - 1) > c.wide) return false;
        shifted.pop_back();
        prepare(shifted, s0, K);
        std::vector<double> terms(K);
        double total = std::pow(lower + pairwise(masses, U), n) - std::pow(lower, n);
        double lower_n = std::pow(lower, n);
        for (int k = 0; k < K; ++k) {
            double phi = lower + survival_sum(k, nullptr, nullptr);
            terms[k] = total * std::exp(-nodes_t[k]) - (std::pow(phi, n) - lower_n);
        }
        out = c.step * pairwise(terms.data(), K) + top * total;
        return true;
    }
};

double l1_error(const std::vector<double>& r, const double* target, std::vector<double>& scratch) {
    scratch.resize(r.size());
    for (std::size_t u = 0; u < r.size(); ++u) scratch[u] = std::fabs(r[u] - target[u]);
    return pairwise(scratch.data(), r.size());
}

double dot(const double* a, const std::vector<double>& b) {
    double sum = 0.0;
    for (std::size_t i = 0; i < b.size(); ++i) sum += a[i] * b[i];
    return sum;
}

// LU with partial pivoting (LAPACK's dgesv, as numpy.linalg.solve): false on an exactly zero pivot.
bool solve(std::vector<double> a, std::vector<double>& b, int size) {
    for (int col = 0; col < size; ++col) {
        int pivot = col;
        for (int i = col + 1; i < size; ++i)
            if (std::fabs(a[static_cast<std::size_t>(i) * size + col]) > std::fabs(a[static_cast<std::size_t>(pivot) * size + col])) pivot = i;
        if (a[static_cast<std::size_t>(pivot) * size + col] == 0.0) return false;
        if (pivot != col) {
            for (int j = 0; j < size; ++j) std::swap(a[static_cast<std::size_t>(col) * size + j], a[static_cast<std::size_t>(pivot) * size + j]);
            std::swap(b[col], b[pivot]);
        }
        double diag = a[static_cast<std::size_t>(col) * size + col];
        for (int i = col + 1; i < size; ++i) {
            double f = a[static_cast<std::size_t>(i) * size + col] / diag;
            if (f == 0.0) continue;
            for (int j = col + 1; j < size; ++j) a[static_cast<std::size_t>(i) * size + j] -= f * a[static_cast<std::size_t>(col) * size + j];
            b[i] -= f * b[col];
        }
    }
    for (int i = size - 1; i >= 0; --i) {
        double sum = b[i];
        for (int j = i + 1; j < size; ++j) sum -= a[static_cast<std::size_t>(i) * size + j] * b[j];
        b[i] = sum / a[static_cast<std::size_t>(i) * size + i];
    }
    return true;
}

}  // namespace

extern "C" int specbound_race_fit(double lower, const double* masses, const double* target, int units, int n,
                                  double step, double low, double high, double tail_low, double wide, double floor,
                                  double max_step, double tolerance, int max_iterations, int max_halvings,
                                  double* out_log_weights, double* out_r) {
    const int U = units;
    Race race{lower, masses, U, n, {step, low, high, tail_low, wide, floor, max_step, tolerance, max_iterations, max_halvings}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
    const Constants& c = race.c;
    // singleton_bounds: the range (l_u, h_u) of r_u, the heaviest unit's complement summed directly.
    double total = pairwise(masses, U);
    int heaviest = static_cast<int>(std::max_element(masses, masses + U) - masses);
    std::vector<double> low_bound(U), high_bound(U), target_logit(U);
    for (int u = 0; u < U; ++u) {
        double others = u == heaviest ? pairwise(masses, u) + pairwise(masses + u + 1, U - u - 1) : total - masses[u];
        low_bound[u] = power_difference(lower + masses[u], lower, masses[u], n);
        high_bound[u] = power_difference(lower + total, lower + others, masses[u], n);
        target_logit[u] = std::log(target[u] - low_bound[u]) - std::log(high_bound[u] - target[u]);
    }
    // The unit holding the median of the target mass centres every step.
    std::vector<int> heavy(U);
    std::iota(heavy.begin(), heavy.end(), 0);
    std::stable_sort(heavy.begin(), heavy.end(), [&](int a, int b) { return target[a] < target[b]; });
    double half = 0.5 * pairwise(target, U), running = 0.0;
    int middle = heavy[U - 1];
    for (int i = 0; i < U; ++i) {
        running += target[heavy[i]];
        if (running >= half) { middle = heavy[i]; break; }
    }
    std::vector<double> log_weights(U);
    double start_top = -INFINITY;
    for (int u = 0; u < U; ++u) start_top = std::max(start_top, std::log(target[u] / masses[u]));
    for (int u = 0; u < U; ++u) log_weights[u] = std::max(std::log(target[u] / masses[u]) - start_top, -c.floor);

    std::vector<double> r, hessian, scratch;
    if (!race.marginal(log_weights, r, hessian)) return 1;
    double error = l1_error(r, target, scratch);
    double best_error = error;
    std::vector<double> best_lw = log_weights, best_r = r;
    bool have_psi = false;
    double psi = 0.0;
    int slow_steps = 0;
    std::vector<double> root(U), inverse_root(U), null(U), system(static_cast<std::size_t>(U) * U), step_vec(U), trial(U), trial_r, trial_hessian;
    for (int iteration = 0; iteration < c.max_iterations; ++iteration) {
        if (error <= c.tolerance) break;
        race.finish_hessian(hessian);  // the current point was the last evaluated (its tables are kept)
        double norm = 0.0;
        for (int u = 0; u < U; ++u) {
            root[u] = std::sqrt(std::max(std::fabs(hessian[static_cast<std::size_t>(u) * U + u]), 1e-300));
            norm += root[u] * root[u];
        }
        norm = std::sqrt(norm);
        for (int u = 0; u < U; ++u) {
            inverse_root[u] = 1.0 / root[u];
            null[u] = root[u] / norm;
        }
        for (int u = 0; u < U; ++u)
            for (int v = 0; v < U; ++v)
                system[static_cast<std::size_t>(u) * U + v] =
                    hessian[static_cast<std::size_t>(u) * U + v] * inverse_root[u] * inverse_root[v] + null[u] * null[v];
        bool accepted = false;
        double trial_error = 0.0;
        for (int logit = 1; logit >= 0 && !accepted; --logit) {
            for (int u = 0; u < U; ++u) {
                double plain = target[u] - r[u];
                double above = r[u] - low_bound[u], below = high_bound[u] - r[u];
                bool inside = above > 0 && below > 0 && std::isfinite(target_logit[u]);
                step_vec[u] = logit && inside
                                  ? (target_logit[u] - (std::log(above) - std::log(below))) * (above * below / (above + below))
                                  : plain;
                step_vec[u] /= root[u];
            }
            if (!solve(system, step_vec, U)) return 1;
            bool finite = true;
            for (int u = 0; u < U; ++u) {
                step_vec[u] /= root[u];
                finite = finite && std::isfinite(step_vec[u]);
            }
            if (!finite) continue;
            double centre = step_vec[middle];
            for (int u = 0; u < U; ++u) step_vec[u] = std::clamp(step_vec[u] - centre, -c.max_step, c.max_step);
            for (int halving = 0; halving < (logit ? 1 : c.max_halvings); ++halving) {
                for (int u = 0; u < U; ++u) trial[u] = log_weights[u] + step_vec[u];
                double top = max_of(trial);
                for (int u = 0; u < U; ++u) trial[u] = std::max(trial[u] - top, -c.floor);
                if (!race.marginal(trial, trial_r, trial_hessian)) return 1;
                trial_error = l1_error(trial_r, target, scratch);
                if (trial_error < error) { accepted = true; break; }
                double potential;
                if (!have_psi) {
                    if (!race.potential(log_weights, potential)) return 1;
                    psi = potential - dot(target, log_weights);
                    have_psi = true;
                }
                if (!race.potential(trial, potential)) return 1;
                if (potential - dot(target, trial) < psi) { accepted = true; break; }
                for (double& x : step_vec) x *= 0.5;
            }
        }
        if (!accepted) break;
        slow_steps = trial_error > 0.5 * error && error < 1e3 * c.tolerance ? slow_steps + 1 : 0;
        log_weights.swap(trial);
        r.swap(trial_r);
        hessian.swap(trial_hessian);
        error = trial_error;
        have_psi = false;
        if (error < best_error) {
            best_error = error;
            best_lw = log_weights;
            best_r = r;
        }
        if (slow_steps >= (error <= 10 * c.tolerance ? 1 : 2)) break;
    }
    std::copy(best_lw.begin(), best_lw.end(), out_log_weights);
    std::copy(best_r.begin(), best_r.end(), out_r);
    return 0;
}

// exp8 over an array (whole vectors, then the rest padded): how tests/theory/test_native.py checks its accuracy.
extern "C" void specbound_exp(const double* x, double* out, std::int64_t size) {
    std::int64_t i = 0;
    for (; i + LANES <= size; i += LANES) store(out + i, exp8(load(x + i)));
    if (i < size) {
        double rest[LANES] = {};
        std::copy(x + i, x + size, rest);
        const Eight value = exp8(load(rest));
        for (std::int64_t j = i; j < size; ++j) out[j] = value[j - i];
    }
}
