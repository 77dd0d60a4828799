// Arithmetic shared by the theory's native functions, each written as the numpy expression it mirrors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

namespace specbound {

// numpy's pairwise sum of a contiguous array (blocks of 8 partial sums up to 128 items, halves above): the sums
// over quadrature nodes keep numpy's ~1e-16 relative round-off instead of a running sum's K eps.
inline double pairwise(const double* a, std::size_t n) {
    if (n < 8) {
        double sum = 0.0;
        for (std::size_t i = 0; i < n; ++i) sum += a[i];
        return sum;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; ++j) r[j] = a[j];
        std::size_t i = 8;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; ++j) r[j] += a[i + j];
        double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; ++i) sum += a[i];
        return sum;
    }
    std::size_t half = n / 2;
    half -= half % 8;
    return pairwise(a, half) + pairwise(a + half, n - half);
}

inline double power(double x, int k) {  // numpy's x**k: x itself for 1, the square for 2, pow otherwise
    if (k == 1) return x;
    if (k == 2) return x * x;
    return std::pow(x, static_cast<double>(k));
}

// h^n - l^n = m * sum_{j<n} h^j l^(n-1-j) (theory._race._power_difference).
inline double power_difference(double high, double low, double mass, int n) {
    if (n == 1) return mass;
    double total = power(low, n - 1);
    for (int j = 1; j < n - 1; ++j) total = total + power(high, j) * power(low, n - 1 - j);
    return mass * (total + power(high, n - 1));
}

// theory._class_units._fill_level on `ratio` sorted increasingly.
inline double fill_level(const std::vector<double>& ratio, const std::vector<double>& weight, double mass, bool above) {
    const std::size_t size = ratio.size();
    std::vector<double> head_p(size + 1, 0.0), head_q(size + 1, 0.0), tail_p(size + 1, 0.0), tail_q(size + 1, 0.0);
    for (std::size_t i = 0; i < size; ++i) {
        head_p[i + 1] = head_p[i] + ratio[i] * weight[i];
        head_q[i + 1] = head_q[i] + weight[i];
    }
    for (std::size_t i = size; i-- > 0;) {
        tail_p[i] = tail_p[i + 1] + ratio[i] * weight[i];
        tail_q[i] = tail_q[i + 1] + weight[i];
    }
    if (above) {  // first break with head_p[j+1] + ratio_j tail_q[j+1] >= mass (searchsorted, side="left")
        std::size_t below = 0;
        while (below < size && head_p[below + 1] + ratio[below] * tail_q[below + 1] < mass) ++below;
        return below < size ? (mass - head_p[below]) / tail_q[below] : INFINITY;
    }
    std::size_t raised = 0;  // breaks with ratio_j head_q[j] + tail_p[j] <= mass (searchsorted, side="right")
    while (raised < size && ratio[raised] * head_q[raised] + tail_p[raised] <= mass) ++raised;
    return raised > 0 ? (mass - tail_p[raised]) / head_q[raised] : -INFINITY;
}

// fill_level on items in any order: sorted by ratio first (stably, as numpy's argsort(kind="stable")).
inline double fill_level_of(const double* ratio, const double* weight, std::size_t size, double mass, bool above) {
    std::vector<std::size_t> order(size);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ratio[a] < ratio[b]; });
    std::vector<double> sorted_ratio(size), sorted_weight(size);
    for (std::size_t i = 0; i < size; ++i) {
        sorted_ratio[i] = ratio[order[i]];
        sorted_weight[i] = weight[order[i]];
    }
    return fill_level(sorted_ratio, sorted_weight, mass, above);
}

}  // namespace specbound
