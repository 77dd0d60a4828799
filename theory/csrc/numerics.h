// Arithmetic shared by the theory's native functions, each written as the numpy expression it mirrors.
#pragma once

#include <cmath>
#include <cstddef>

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

}  // namespace specbound
