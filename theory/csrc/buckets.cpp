// The ratio buckets of theory/_buckets.py (bucketed) in C++.
//
// Why: at V = 49,152 the numpy function is ~70 array calls, most on a few hundred buckets, and about eight passes
// over the vocabulary; the calls cost more than the passes (0.8-1.9 ms a build). Here each step is one loop. The
// Python function is the specification and the oracle: the items are bitwise the same (the same sums in the same
// order: bincounts add in token order, cumulative sums run left to right, the grouping test evaluates the same
// expressions), checked by tests/theory/test_native.py on logged SmolLM2 pairs and random rows.
//
// Returns the number of items, or -1 where the numpy function must run instead.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

double nan_min(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : (a < b ? a : b); }
double nan_max(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : (a > b ? a : b); }

double edge(int64_t key, int shift) {  // the ratio at the start of fine key `key`
    int64_t bits = static_cast<int64_t>(static_cast<uint64_t>(key) << shift);
    double value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

int64_t ratio_key(double p, double q, int shift) {
    double ratio = p / q;
    int64_t bits;
    std::memcpy(&bits, &ratio, sizeof bits);
    return bits >> shift;  // arithmetic, as numpy's right_shift on int64
}

// theory._buckets._groupable: which buckets may be grouped.
void groupable(const std::vector<double>& bucket_p, const std::vector<double>& bucket_q,
               const std::vector<double>& light_p, const std::vector<double>& light_q,
               const std::vector<double>& low, const std::vector<double>& high, int n, double tight, double margin,
               std::vector<char>& out) {
    const std::size_t B = bucket_p.size();
    std::vector<double> head_p(B + 1), head_q(B + 1), power(B + 1), boundary(B + 1);
    head_p[0] = 0.0;
    head_q[0] = 0.0;
    for (std::size_t b = 0; b < B; ++b) {
        head_p[b + 1] = head_p[b] + bucket_p[b];
        head_q[b + 1] = head_q[b] + bucket_q[b];
    }
    double lowest = 0.0;
    std::size_t cut = 0;
    for (std::size_t b = 0; b <= B; ++b) {
        head_q[b] = nan_min(head_q[b], 1.0);
        power[b] = head_q[b];
        for (int j = 0; j < n - 1; ++j) power[b] *= head_q[b];
        boundary[b] = head_p[b] - power[b];
        if (boundary[b] < boundary[cut]) cut = b;
    }
    lowest = std::min(boundary[cut], 0.0);
    std::vector<double> slack(B), push(B), total(B + 1);
    for (std::size_t b = 0; b < B; ++b) {
        bool below = b < cut;
        double inner = bucket_q[b] > 0 ? head_p[b] + low[b] * bucket_q[b] - power[b + 1] : head_p[b + 1] - power[b + 1];
        double raw = below ? high[b] * light_q[b] - light_p[b] : light_p[b] - low[b] * light_q[b];
        slack[b] = nan_min(boundary[b], inner) - lowest - tight - margin;
        push[b] = nan_max(raw, 0.0) + 4e-16 * light_p[b];
    }
    total[0] = 0.0;
    for (std::size_t b = 0; b < B; ++b) total[b + 1] = total[b] + (slack[b] > push[b] ? push[b] : 0.0);
    out.assign(B, 0);
    for (std::size_t b = 0; b < B; ++b) {
        bool fits = slack[b] > push[b];
        double between = b < cut ? total[cut] - total[b] : total[b + 1] - total[cut];
        out[b] = fits && slack[b] > between;
    }
}

}  // namespace

extern "C" int64_t specbound_bucketed(const double* ps, const double* qs, int64_t size, int n, double group_below,
                                      double tight, double margin, const int64_t* absent, int64_t absent_count,
                                      int shift, int coarse_shift, double* item_p, double* item_q, double* item_low,
                                      double* item_high, uint8_t* item_single, int64_t* item_count, int64_t* item) {
    const int64_t split_width = int64_t{1} << coarse_shift;  // fine buckets per coarse bucket
    // Vocabulary-sized scratch kept per thread (a fresh array costs page faults on first touch), reached
    // through plain pointers: each thread_local access from a shared library is a call to __tls_get_addr. The
    // keys are stored as int32 (a fine key is the top 20 bits of the ratio's bit pattern): the passes over
    // the vocabulary are memory-bound, and half-width keys halve their traffic.
    static thread_local std::vector<int32_t> fine_keys, coarse_keys;
    static thread_local std::vector<char> absent_flags;
    fine_keys.resize(size);
    coarse_keys.resize(size);
    int32_t* const fine = fine_keys.data();
    int32_t* const coarse = coarse_keys.data();
    const char* is_absent = nullptr;
    if (absent_count > 0) {
        absent_flags.assign(size, 0);
        for (int64_t a = 0; a < absent_count; ++a) absent_flags[absent[a]] = 1;
        is_absent = absent_flags.data();
    }
    int64_t base = std::numeric_limits<int64_t>::max(), top = std::numeric_limits<int64_t>::min();
    for (int64_t i = 0; i < size; ++i) {
        int64_t key = ratio_key(ps[i], qs[i], shift);
        fine[i] = static_cast<int32_t>(key);
        base = std::min(base, key >> coarse_shift);
        if (!is_absent || !is_absent[i]) top = std::max(top, key >> coarse_shift);
    }
    if (top == std::numeric_limits<int64_t>::min()) top = base;  // every token absent: numpy's max is base
    top -= base;
    if (top < 0 || top > (int64_t{1} << 24) || shift < 33) return -1;  // keys must fit int32
    const int64_t heavy_key = top + 1, absent_key = top + 2;
    const int64_t keys = absent_count > 0 ? absent_key + 1 : heavy_key + 1;
    std::vector<int64_t> heavy, heavy_coarse;
    std::vector<int64_t> count(keys, 0);
    std::vector<double> light_p(keys, 0.0), light_q(keys, 0.0);
    for (int64_t i = 0; i < size; ++i) {
        int64_t key = (fine[i] >> coarse_shift) - base;
        if (is_absent && is_absent[i]) {
            key = absent_key;
        } else if (ps[i] >= group_below || qs[i] >= group_below) {
            heavy.push_back(i);
            heavy_coarse.push_back(key);
            key = heavy_key;
        }
        coarse[i] = static_cast<int32_t>(key);
        ++count[key];
        light_p[key] += ps[i];
        light_q[key] += qs[i];
    }
    // Buckets holding a light or a heavy token, with the heavy tokens' masses added after the light sums.
    std::vector<int64_t> every(count.begin(), count.begin() + heavy_key);
    for (int64_t key : heavy_coarse) ++every[key];
    std::vector<int64_t> nonempty, position_of(heavy_key, -1);
    for (int64_t key = 0; key < heavy_key; ++key)
        if (every[key]) {
            position_of[key] = static_cast<int64_t>(nonempty.size());
            nonempty.push_back(key);
        }
    const std::size_t buckets = nonempty.size();
    std::vector<double> bucket_p(buckets), bucket_q(buckets), bucket_light_p(buckets), bucket_light_q(buckets),
        low(buckets), high(buckets);
    for (std::size_t b = 0; b < buckets; ++b) {
        bucket_p[b] = bucket_light_p[b] = light_p[nonempty[b]];
        bucket_q[b] = bucket_light_q[b] = light_q[nonempty[b]];
        low[b] = edge((nonempty[b] + base) * split_width, shift);
        high[b] = edge((nonempty[b] + base + 1) * split_width, shift);
    }
    for (std::size_t h = 0; h < heavy.size(); ++h) {
        bucket_p[position_of[heavy_coarse[h]]] += ps[heavy[h]];
        bucket_q[position_of[heavy_coarse[h]]] += qs[heavy[h]];
    }
    std::vector<char> nonempty_ok;
    groupable(bucket_p, bucket_q, bucket_light_p, bucket_light_q, low, high, n, tight, margin, nonempty_ok);
    std::vector<char> coarse_ok(keys, 0);
    for (std::size_t b = 0; b < buckets; ++b)
        if (nonempty_ok[b]) coarse_ok[nonempty[b]] = 1;
    for (int64_t key = heavy_key; key < keys; ++key) coarse_ok[key] = 1;
    // Light tokens of the buckets to split (token order) and the heavy tokens of those buckets.
    std::vector<int64_t> split;
    if (!std::all_of(nonempty_ok.begin(), nonempty_ok.end(), [](char ok) { return ok != 0; })) {
        split.resize(size);
        std::size_t kept = 0;
        for (int64_t i = 0; i < size; ++i) {  // branch-free: most tokens' buckets are kept whole
            split[kept] = i;
            kept += !coarse_ok[coarse[i]];
        }
        split.resize(kept);
    }
    // Slots in ratio order, keyed by their first absolute fine key: the groupable coarse buckets and the fine
    // keys present in the split ones. numpy sorts the union of both key lists; walking the coarse buckets in
    // order and, inside a split bucket, its fine keys in order gives the same list without a sort, and tables
    // (a coarse bucket's slot; a split bucket's fine key's slot) give a token's slot without a binary search
    // (numpy's searchsorted: ~10 mispredicted branches per token, a fifth of the call on a trained head's rows).
    std::vector<int64_t> split_ordinal(heavy_key, -1), whole_slot(heavy_key, -1);
    int64_t split_buckets = 0;
    for (std::size_t b = 0; b < buckets; ++b)
        if (!nonempty_ok[b]) split_ordinal[nonempty[b]] = split_buckets++;
    std::vector<int64_t> fine_slot(split_buckets * split_width, -1);  // 0 marks a key present, then its slot
    auto fine_entry = [&](int64_t coarse_key, int32_t fine_key) -> int64_t& {
        return fine_slot[split_ordinal[coarse_key] * split_width + (fine_key & (split_width - 1))];
    };
    for (int64_t i : split) fine_entry(coarse[i], fine[i]) = 0;
    for (std::size_t h = 0; h < heavy.size(); ++h)
        if (!coarse_ok[heavy_coarse[h]]) fine_entry(heavy_coarse[h], fine[heavy[h]]) = 0;
    std::vector<int64_t> used;
    for (std::size_t b = 0; b < buckets; ++b) {
        const int64_t key = nonempty[b], first_fine = (key + base) * split_width;
        if (nonempty_ok[b]) {
            whole_slot[key] = static_cast<int64_t>(used.size());
            used.push_back(first_fine);
            continue;
        }
        int64_t* entries = &fine_slot[split_ordinal[key] * split_width];
        for (int64_t k = 0; k < split_width; ++k)
            if (entries[k] == 0) {
                entries[k] = static_cast<int64_t>(used.size());
                used.push_back(first_fine + k);
            }
    }
    const std::size_t slots = used.size();
    auto slot_of = [&](int64_t token) -> int64_t {  // searchsorted(used, fine key, side="right") - 1
        const int64_t key = (fine[token] >> coarse_shift) - base;
        return coarse_ok[key] ? whole_slot[key] : fine_entry(key, fine[token]);
    };
    std::vector<char> coarse_slot(slots);
    std::vector<double> group_p(slots, 0.0), group_q(slots, 0.0), slot_low(slots), slot_high(slots);
    std::vector<int64_t> light_count(slots, 0), heavy_count(slots, 0), coarse_item(keys, -1);
    for (std::size_t s = 0; s < slots; ++s) {
        int64_t whole = (used[s] >> coarse_shift) - base;
        coarse_slot[s] = coarse_ok[whole];
        if (coarse_slot[s]) {
            group_p[s] = light_p[whole];
            group_q[s] = light_q[whole];
            light_count[s] = count[whole];
        }  // the fine slots' masses and counts follow, from the split tokens
        slot_low[s] = edge(used[s], shift);
        slot_high[s] = edge(used[s] + (coarse_slot[s] ? split_width : 1), shift);
    }
    // Split tokens' masses by fine slot, in token order (a bincount over the unique fine keys): a fine slot's
    // sums start at the 0 set above.
    std::vector<int64_t> split_slot(split.size());
    for (std::size_t j = 0; j < split.size(); ++j) {
        int64_t s = fine_entry(coarse[split[j]], fine[split[j]]);
        split_slot[j] = s;
        group_p[s] += ps[split[j]];
        group_q[s] += qs[split[j]];
        ++light_count[s];
    }
    std::vector<double> slot_p(group_p), slot_q(group_q);
    for (std::size_t h = 0; h < heavy.size(); ++h) {
        int64_t s = slot_of(heavy[h]);
        slot_p[s] += ps[heavy[h]];
        slot_q[s] += qs[heavy[h]];
        ++heavy_count[s];
    }
    std::vector<char> ok;
    groupable(slot_p, slot_q, group_p, group_q, slot_low, slot_high, n, tight, margin, ok);
    // Item positions: each slot's group first, then its singles in ratio order.
    std::vector<int64_t> grouped_count(slots), first(slots), group_item(slots);
    int64_t items = 0;
    for (std::size_t s = 0; s < slots; ++s) {
        grouped_count[s] = ok[s] ? light_count[s] : 0;
        int64_t singles_here = light_count[s] - grouped_count[s] + heavy_count[s];
        first[s] = items;
        group_item[s] = grouped_count[s] > 0 ? first[s] : -1;
        items += (grouped_count[s] > 0) + singles_here;
    }
    for (std::size_t s = 0; s < slots; ++s)
        if (coarse_slot[s]) coarse_item[(used[s] >> coarse_shift) - base] = group_item[s];
    if (absent_count > 0) coarse_item[absent_key] = items;
    for (int64_t i = 0; i < size; ++i) item[i] = coarse_item[coarse[i]];
    for (std::size_t j = 0; j < split.size(); ++j) item[split[j]] = group_item[split_slot[j]];
    // Singles: every token without an item, ordered by slot, then ratio (stable: token order on ties).
    struct Single {
        int64_t token, slot;
        double ratio;
    };
    std::vector<Single> singles;
    auto add_single = [&](int64_t i) { singles.push_back({i, slot_of(i), ps[i] / qs[i]}); };
    bool whole_slots_grouped = true;
    for (std::size_t s = 0; s < slots; ++s) whole_slots_grouped &= !coarse_slot[s] || ok[s];
    if (whole_slots_grouped) {  // the singles are the heavy tokens and split tokens left out: no vocabulary pass
        std::size_t h = 0;
        for (std::size_t j = 0; j < split.size(); ++j) {  // both lists in token order: merged
            if (group_item[split_slot[j]] >= 0) continue;
            for (; h < heavy.size() && heavy[h] < split[j]; ++h) add_single(heavy[h]);
            add_single(split[j]);
        }
        for (; h < heavy.size(); ++h) add_single(heavy[h]);
    } else {  // a whole coarse bucket failed the second test: its tokens are single too
        for (int64_t i = 0; i < size; ++i)
            if (item[i] < 0) add_single(i);
    }
    std::stable_sort(singles.begin(), singles.end(), [](const Single& a, const Single& b) {
        if (a.slot != b.slot) return a.slot < b.slot;
        bool a_nan = std::isnan(a.ratio), b_nan = std::isnan(b.ratio);  // numpy sorts NaN last
        if (a_nan || b_nan) return !a_nan && b_nan;
        return a.ratio < b.ratio;
    });
    for (std::size_t s = 0; s < slots; ++s)
        if (group_item[s] >= 0) {
            int64_t g = group_item[s];
            item_p[g] = group_p[s];
            item_q[g] = group_q[s];
            item_single[g] = 0;
            item_low[g] = slot_low[s];
            item_high[g] = slot_high[s];
            item_count[g] = grouped_count[s];
        }
    std::size_t j = 0;
    while (j < singles.size()) {
        std::size_t start = j;
        int64_t slot = singles[j].slot;
        for (; j < singles.size() && singles[j].slot == slot; ++j) {
            int64_t at = first[slot] + (grouped_count[slot] > 0) + static_cast<int64_t>(j - start);
            item[singles[j].token] = at;
            item_p[at] = ps[singles[j].token];
            item_q[at] = qs[singles[j].token];
            item_single[at] = 1;
            item_low[at] = item_high[at] = singles[j].ratio;
            item_count[at] = 1;
        }
    }
    return items;
}
