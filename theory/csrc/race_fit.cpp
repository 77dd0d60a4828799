// The race fit of theory/_race.py (fit_log_weights: newton_fit on race_marginal / race_potential) in C++.
//
// Why: a class of the optimal verifier's build has ~35 units and ~100 quadrature nodes, so one numpy evaluation of
// the race marginal and its Jacobian (~20 array operations on 3,500 numbers) costs ~100 us, almost all of it the
// per-call cost of numpy; the Newton loop around it (a 35 x 35 solve, clips, norms) as much again. Here the same
// arithmetic runs in one call. The Python module is the specification and the oracle (tests/theory/
// test_native.py): every formula below is the one of the function it names there, and the marginal returned
// is the one evaluated at the returned log-weights, which is all losslessness needs. Plain C ABI (ctypes), no
// fast-math: IEEE double throughout, so sums differ from numpy's by round-off only.
//
// Return codes of specbound_race_fit: 0 done; 1 a case the Python fit handles (a singular Newton system, a node
// window past WIDE); the caller then runs the numpy fit.

#include <algorithm>
#include <cmath>
#include <cstddef>
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
    // Scratch, reused across evaluations.
    std::vector<double> clock, survive, phi, power_k, weighted, row, scaled, weighted_scaled;

    // Quadrature nodes s = ln t from `low` (shifted by the largest log-weight) past HIGH - min(log-weights).
    int nodes(const std::vector<double>& lw, double low, double& first) const {
        double lo = low - max_of(lw);
        double hi = c.high - *std::min_element(lw.begin(), lw.end());
        first = lo;
        return static_cast<int>(std::ceil((hi - lo) / c.step)) + 1;
    }

    // theory._race.race_marginal (jacobian=True); false where the window passes WIDE (the log-space clocks).
    bool marginal(std::vector<double> lw, std::vector<double>& r, std::vector<double>& hessian) {
        const int U = units;
        r.assign(U, 0.0);
        hessian.assign(static_cast<std::size_t>(U) * U, 0.0);
        if (n == 2) return bradley_terry(lw, r, hessian);
        double top = max_of(lw);
        for (double& x : lw) x -= top;
        double s0;
        const int K = nodes(lw, c.tail_low, s0);
        if (s0 + c.step * (K - 1) > c.wide) return false;
        std::vector<double> t(K), w(U);
        for (int k = 0; k < K; ++k) t[k] = std::exp(s0 + c.step * k);
        for (int u = 0; u < U; ++u) w[u] = std::exp(lw[u]);
        clock.resize(static_cast<std::size_t>(U) * K);
        survive.resize(clock.size());
        phi.assign(K, 0.0);
        for (int u = 0; u < U; ++u) {
            double* cl = &clock[static_cast<std::size_t>(u) * K];
            double* sv = &survive[static_cast<std::size_t>(u) * K];
            for (int k = 0; k < K; ++k) {
                cl[k] = w[u] * t[k];
                sv[k] = std::exp(-cl[k]);
                phi[k] += masses[u] * sv[k];
            }
        }
        power_k.resize(K);
        for (int k = 0; k < K; ++k) {
            phi[k] = lower + phi[k];
            power_k[k] = power(phi[k], n - 2);
        }
        // Lower tail (theory._race._lower_tail), to second order in t.
        double mass_total = pairwise(masses, U);
        double weighted_sum = 0.0;
        for (int u = 0; u < U; ++u) weighted_sum += masses[u] * w[u];
        double total = lower + mass_total;
        double tail_power = power(total, n - 2);
        double start = t[0];
        weighted.resize(clock.size());
        row.resize(K);
        // (K, U) node-major with rows padded with zeros to a multiple of 8: the Hessian's inner loop runs over v.
        const int stride = (U + 7) / 8 * 8;
        scaled.assign(static_cast<std::size_t>(K) * stride, 0.0);
        for (int u = 0; u < U; ++u) {
            double* cl = &clock[static_cast<std::size_t>(u) * K];
            double* sv = &survive[static_cast<std::size_t>(u) * K];
            double* wt = &weighted[static_cast<std::size_t>(u) * K];
            for (int k = 0; k < K; ++k) {
                double density = cl[k] * sv[k];
                wt[k] = density * (power_k[k] * phi[k]);
                scaled[static_cast<std::size_t>(k) * stride + u] = density * masses[u];
            }
            double linear = c.step * start / std::expm1(c.step) * (tail_power * total) * w[u];
            double drift = w[u] * (tail_power * total) + (n - 1) * tail_power * weighted_sum;
            double quadratic = c.step * start * start / std::expm1(2.0 * c.step) * w[u] * drift;
            double nq = n * masses[u];
            r[u] = nq * (c.step * pairwise(wt, K) + (linear - quadratic));
            for (int k = 0; k < K; ++k) row[k] = (1.0 - cl[k]) * wt[k];
            hessian[static_cast<std::size_t>(u) * U + u] = nq * (c.step * pairwise(row.data(), K) + linear);
        }
        // cross_uv = n (n - 1) h sum_k scaled_uk power_k scaled_vk, subtracted from the diagonal matrix.
        // Symmetric: for 4 rows u at a time, blocks of 8 columns v from the diagonal's block on, each summed over
        // the nodes in registers (4 independent FMA chains share each load), then mirrored. `weighted_scaled` is
        // scaled * power, so that each node costs one load, four broadcasts and four FMAs.
        weighted_scaled.resize(scaled.size());
        for (int k = 0; k < K; ++k)
            for (int u = 0; u < stride; ++u)
                weighted_scaled[static_cast<std::size_t>(k) * stride + u] = scaled[static_cast<std::size_t>(k) * stride + u] * power_k[k];
        double factor = n * (n - 1) * c.step;
        for (int u0 = 0; u0 < U; u0 += 4) {
            for (int v0 = u0 - u0 % 8; v0 < U; v0 += 8) {
                Eight sum[4] = {};
                for (int k = 0; k < K; ++k) {
                    const double* sk = &scaled[static_cast<std::size_t>(k) * stride];
                    const double* wk = &weighted_scaled[static_cast<std::size_t>(k) * stride];
                    Eight block;  // columns v0 .. v0 + 7 of node k
                    std::memcpy(&block, sk + v0, sizeof block);
                    for (int i = 0; i < 4; ++i) sum[i] += wk[u0 + i] * block;
                }
                for (int u = u0; u < std::min(U, u0 + 4); ++u)
                    for (int v = std::max(u, v0); v < std::min(U, v0 + 8); ++v) {
                        double term = factor * sum[u - u0][v - v0];
                        hessian[static_cast<std::size_t>(u) * U + v] -= term;
                        if (v != u) hessian[static_cast<std::size_t>(v) * U + u] -= term;
                    }
            }
        }
        return true;
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
    bool potential(const std::vector<double>& lw, double& out) const {
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
        std::vector<double> terms(K);
        std::vector<double> w(U + 1);
        for (int u = 0; u <= U; ++u) w[u] = std::exp(shifted[u]);
        double total = std::pow(lower + pairwise(masses, U), n) - std::pow(lower, n);
        double lower_n = std::pow(lower, n);
        for (int k = 0; k < K; ++k) {
            double t = std::exp(s0 + c.step * k);
            double phi = 0.0;
            for (int u = 0; u < U; ++u) phi += std::exp(-w[u] * t) * masses[u];
            phi = lower + phi;
            terms[k] = total * std::exp(-w[U] * t) - (std::pow(phi, n) - lower_n);
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
    Race race{lower, masses, U, n, {step, low, high, tail_low, wide, floor, max_step, tolerance, max_iterations, max_halvings}, {}, {}, {}, {}, {}, {}, {}, {}};
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
