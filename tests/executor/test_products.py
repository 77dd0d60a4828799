"""The CPU matrix products: MKL formulations equal F.linear up to round-off; oneDNN's packed copy equals it too,
does not depend on how many rows share a call, follows every change of its weight, is freed with it and never
serves autograd."""

from __future__ import annotations

import contextlib
import copy
import gc
import time
import weakref

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from executor import products
from executor.products import linear, packed_linear, packing_applies

seeds = st.integers(0, 2**16)
#: Activations (2, n, columns) against a (rows, columns) weight: the shapes of the packed-product properties.
product_shapes = dict(
    n=st.integers(1, 40),
    rows=st.sampled_from([1, 7, 64, 300]),
    columns=st.sampled_from([8, 24, 96]),
    seed=seeds,
)

needs_onednn = pytest.mark.skipif(not products.packing_available(), reason="this torch build has no oneDNN")
needs_native_bf16 = pytest.mark.skipif(
    not (products.packing_available() and products.NATIVE_CPU_BF16),
    reason="packed bfloat16 runs only on CPUs with avx512_bf16 or AMX (executor.products.NATIVE_CPU_BF16)",
)


# Skipped only where the CPU lacks the instructions: on a CPU that has them, a kernel that fails to build or
# fails its probe (and so would silently fall back to oneDNN) fails these tests.
def native_kernel(dtype):
    return pytest.param(
        dtype,
        marks=pytest.mark.skipif(
            not products._cpu_has(products.NATIVE_KERNELS[dtype][1]),
            reason=f"the native {dtype} kernel needs a CPU with {', '.join(products.NATIVE_KERNELS[dtype][1])}",
        ),
    )


def native_operands(dtype, n, rows, columns, seed):
    """Random activations ``(n, columns)`` and weight ``(rows, columns)`` for the native kernel of ``dtype``, which
    must have built (a kernel that fails its probe would silently fall back to oneDNN)."""
    assert products.native_available(dtype), "the kernel did not build or failed its probe (see stderr)"
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, columns, generator=generator).to(dtype)
    return x, torch.randn(rows, columns, generator=generator).to(dtype)


native_dtypes = pytest.mark.parametrize(
    "dtype", [native_kernel(torch.bfloat16), native_kernel(torch.float32)], ids=["bfloat16", "float32"]
)


@contextlib.contextmanager
def onednn_from(dtype, rows):
    """The native kernel of ``dtype`` (where it runs) hands products of ``rows`` rows or more to oneDNN (``None``:
    never) for the duration."""
    operator = products._native_op(dtype)
    if operator is None:
        yield
        return
    saved = operator.onednn_rows
    operator.onednn_rows = rows
    try:
        yield
    finally:
        operator.onednn_rows = saved


def float32_copies():
    """The table of the packed float32 copies: the native kernel's where it runs, else oneDNN's."""
    return products._PACKED_NATIVE if products.native_available(torch.float32) else products._PACKED


@given(n=st.integers(1, 70), rows=st.sampled_from([1, 7, 64, 300]), seed=seeds)
def test_cpu_linear_equals_f_linear_up_to_round_off(n, rows, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, n, 24, generator=generator)
    weight = torch.randn(rows, 24, generator=generator)
    result = linear(x, weight)
    assert result.shape == (1, n, rows)
    torch.testing.assert_close(result, torch.nn.functional.linear(x, weight), atol=1e-5, rtol=1e-5)


@given(n=st.integers(1, 20), rows=st.sampled_from([5, 300, 5000]), seed=seeds)
def test_cpu_linear_in_bfloat16_equals_f_linear_up_to_one_rounding(n, rows, seed):
    # 8+ rows go through float32 blocks: the products are exact and the sums float32 in both, so the
    # results differ by at most one bfloat16 rounding step (relative 2**-8) of the float32 value.
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, 24, generator=generator).bfloat16()
    weight = torch.randn(rows, 24, generator=generator).bfloat16()
    exact = x.double() @ weight.double().T
    result = linear(x, weight)
    assert result.dtype == torch.bfloat16 and result.shape == (2, n, rows)
    assert ((result.double() - exact).abs() <= 2**-8 * exact.abs() + 1e-6).all()


@needs_onednn
@given(**product_shapes)
def test_packed_product_equals_f_linear_up_to_round_off(n, rows, columns, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, columns, generator=generator)
    weight = torch.randn(rows, columns, generator=generator)
    with torch.no_grad():
        result = packed_linear(x, weight)
    assert result.shape == (2, n, rows) and result.dtype == torch.float32
    torch.testing.assert_close(result, torch.nn.functional.linear(x, weight), atol=1e-5, rtol=1e-5)


@needs_native_bf16
@given(**product_shapes)
def test_packed_bfloat16_product_is_the_exact_product_rounded_once(n, rows, columns, seed):
    # bfloat16 products are exact in oneDNN's float32 accumulator; the sum is rounded once to bfloat16.
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, columns, generator=generator).bfloat16()
    weight = torch.randn(rows, columns, generator=generator).bfloat16()
    exact = x.double() @ weight.double().T
    with torch.no_grad():
        result = packed_linear(x, weight)
    assert result.shape == (2, n, rows) and result.dtype == torch.bfloat16
    assert ((result.double() - exact).abs() <= 2**-8 * exact.abs() + 1e-5).all()


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, pytest.param(torch.bfloat16, marks=needs_native_bf16)],
    ids=["float32", "bfloat16"],
)
@needs_onednn
@given(n=st.integers(2, 40), seed=seeds)
def test_packed_rows_are_bitwise_the_one_row_products(dtype, n, seed):
    # What makes an n-token verification pass project exactly as n one-token passes, below the row count from
    # which oneDNN takes over from a native kernel (that one is measured per CPU; here it is set above n).
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 96, generator=generator).to(dtype)
    weight = torch.randn(300, 96, generator=generator).to(dtype)
    with torch.no_grad(), onednn_from(dtype, n + 1):
        together = packed_linear(x, weight)
        alone = torch.cat([packed_linear(x[i : i + 1], weight) for i in range(n)])
    assert torch.equal(together, alone)


@needs_onednn
def test_the_packed_copy_follows_in_place_changes_and_replaced_storage():
    weight = torch.nn.Parameter(torch.randn(32, 16), requires_grad=False)
    x = torch.randn(3, 16)
    with torch.no_grad():
        packed_linear(x, weight)
        weight.mul_(2)  # in place: the version counter moves
        torch.testing.assert_close(packed_linear(x, weight), x @ weight.T, atol=1e-5, rtol=1e-5)
        weight.data = torch.randn(32, 16)  # new storage under the same Parameter (what Module.to does)
        torch.testing.assert_close(packed_linear(x, weight), x @ weight.T, atol=1e-5, rtol=1e-5)


@needs_onednn
def test_a_stale_packed_copy_would_be_caught():
    # Negative control for the test above: a copy that never repacks gives the old weight's product.
    weight = torch.randn(32, 16)
    x = torch.randn(3, 16)
    with torch.no_grad():
        before = packed_linear(x, weight)
        table = float32_copies()
        key, storage, blocked = table[weight]
        weight.mul_(2)
        fresh_key = (weight.data_ptr(), weight._version, weight.shape, weight.stride())
        table[weight] = (fresh_key, storage, blocked)  # pretend nothing changed
        assert key != fresh_key and torch.equal(packed_linear(x, weight), before)


@needs_onednn
def test_the_packed_copy_is_freed_with_its_weight():
    # Watched through a weak reference to the copy itself: counting the table's entries would also count other
    # tests' weights that the same collection frees.
    weight = torch.randn(32, 16)
    with torch.no_grad():
        packed_linear(torch.randn(1, 16), weight)
    copy_alive = weakref.ref(float32_copies()[weight][2])
    assert copy_alive() is not None
    del weight
    gc.collect()
    assert copy_alive() is None


def test_packing_never_serves_autograd_mixed_or_emulated_dtypes_small_weights_or_a_disabled_build(
    monkeypatch,
):
    weight = torch.randn(1024, 256, requires_grad=True)
    x = torch.randn(2, 256)
    assert not packing_applies(x, weight)  # gradients enabled
    with torch.no_grad():
        assert packing_applies(x, weight) == products.packing_available()
        # bfloat16 only where the CPU multiplies it natively; never mixed dtypes or half precision
        assert packing_applies(x.bfloat16(), weight.bfloat16()) == (
            products.packing_available() and products.NATIVE_CPU_BF16
        )
        assert not packing_applies(x.bfloat16(), weight) and not packing_applies(x, weight.bfloat16())
        assert not packing_applies(x.half(), weight.half())
        assert not packing_applies(x[:, :16], weight[:16, :16])  # below MIN_PACKED_ELEMENTS: MKL is faster
        with products.switches(packed=False):
            assert not products.packing_available() and not packing_applies(x, weight)


@needs_onednn
def test_a_deep_copied_model_packs_its_own_weights_and_computes_the_same(tiny_model, monkeypatch):
    monkeypatch.setattr(products, "MIN_PACKED_ELEMENTS", 0)  # pack even a test model's small weights
    model = tiny_model(3)
    model.setup_cache(8)
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        first = model(tokens, torch.arange(5))
        twin = copy.deepcopy(model)  # an opaque oneDNN tensor cannot be deep-copied: the copy repacks
        twin.setup_cache(8)
        assert torch.equal(twin(tokens, torch.arange(5)), first)


@needs_onednn
def test_a_packed_model_runs_every_product_packed_and_equals_the_plain_one(tiny_model, monkeypatch):
    monkeypatch.setattr(products, "MIN_PACKED_ELEMENTS", 0)  # pack even a test model's small weights
    model = tiny_model(5)
    model.setup_cache(12)
    tokens = torch.tensor([[2, 7, 1, 8, 2, 8, 1, 8]])
    calls = []
    original = products._packed_linear_cpu
    monkeypatch.setattr(products, "_packed_linear_cpu", lambda x, w: calls.append(w.shape) or original(x, w))
    with torch.no_grad():
        packed = model(tokens, torch.arange(8))
        # wqkv, wo, w13, w2 per layer, and the tied head
        assert len(calls) == 4 * model.config.n_layers + 1
        with products.switches(packed=False):
            plain = model(tokens, torch.arange(8))
        assert len(calls) == 4 * model.config.n_layers + 1
    torch.testing.assert_close(packed, plain, atol=1e-4, rtol=1e-4)


@native_dtypes
@given(
    n=st.integers(1, 20),
    rows=st.sampled_from([1, 15, 16, 17, 300]),
    columns=st.sampled_from([2, 30, 576]),
    seed=seeds,
)
def test_native_kernel_is_the_exact_product_rounded_once(dtype, n, rows, columns, seed):
    # Called directly, on row counts around its 16-row blocks. Products of bfloat16 are exact in float32 and
    # bfloat16 rounds the float32 sum once (2**-8); float32 sums round each step (2**-24 per term).
    x, weight = native_operands(dtype, n, rows, columns, seed)
    exact = x.double() @ weight.double().T
    operator, packed = products._native_op(dtype), products._native_copy(weight)
    result = operator(x, packed, rows)
    assert result.shape == (n, rows) and result.dtype == dtype
    scale = x.double().abs() @ weight.double().abs().T
    rounding = 2**-8 if dtype == torch.bfloat16 else 0.0
    assert ((result.double() - exact).abs() <= rounding * exact.abs() + 2**-20 * scale + 1e-30).all()
    alone = torch.cat([operator(x[i : i + 1], packed, rows) for i in range(n)])
    assert torch.equal(result, alone)


@native_dtypes
def test_packed_products_run_on_the_native_kernel_and_follow_their_weight(dtype):
    assert products.native_available(dtype), "the kernel did not build or failed its probe (see stderr)"
    weight = torch.randn(48, 64).to(dtype)
    x = torch.randn(3, 64).to(dtype)
    with torch.no_grad():
        before = packed_linear(x, weight)
        assert weight in products._PACKED_NATIVE and weight not in products._PACKED
        weight.mul_(2)  # in place: repacked
        assert torch.equal(packed_linear(x, weight), 2 * before)  # scaling by 2 is exact
        if dtype == torch.bfloat16:  # odd columns: oneDNN's product
            odd = torch.randn(48, 63).bfloat16()
            packed_linear(torch.randn(1, 63).bfloat16(), odd)
            assert odd in products._PACKED and odd not in products._PACKED_NATIVE


def raw_native_op(dtype):
    """The kernel's own operator, which takes the group size."""
    if dtype == torch.bfloat16:
        return torch.ops.specbound_native.bf16_linear
    return torch.ops.specbound_native_f32.f32_linear


@native_dtypes
@given(
    n=st.integers(1, 20),
    rows=st.sampled_from([1, 16, 17, 96, 97, 200, 300]),
    columns=st.sampled_from([2, 30, 576]),
    seed=seeds,
)
def test_the_group_size_changes_no_output_bit(dtype, n, rows, columns, seed):
    # Around multiples of 4 and 6 blocks of 16 rows (96 = 6 blocks), with row chunks of up to 8 and beyond.
    x, weight = native_operands(dtype, n, rows, columns, seed)
    packed, raw = products._native_copy(weight), raw_native_op(dtype)
    assert torch.equal(raw(x, packed, rows, 4), raw(x, packed, rows, 6))
    assert torch.equal(raw(x, packed, rows), raw(x, packed, rows, 4))  # the schema's default
    assert products._native_op(dtype).group in products.NATIVE_GROUPS


@native_dtypes
def test_the_kernels_refuse_another_group_size(dtype):
    assert products.native_available(dtype)
    weight = torch.randn(16, 8).to(dtype)
    with pytest.raises(RuntimeError, match="group must be 4 or 6"):
        raw_native_op(dtype)(torch.randn(1, 8).to(dtype), products._native_copy(weight), 16, 5)


@native_dtypes
@needs_onednn
@pytest.mark.parametrize("n", [8, 9, 40])
def test_from_the_onednn_row_count_products_run_on_onednn_and_stay_exact_up_to_rounding(dtype, n):
    x, weight = native_operands(dtype, n, 300, 96, seed=n)
    exact = x.double() @ weight.double().T
    with torch.no_grad(), onednn_from(dtype, 9):
        result = packed_linear(x, weight)
    assert (weight in products._PACKED) == (n >= 9)  # oneDNN's blocked copy exists once oneDNN ran
    assert (weight in products._PACKED_NATIVE) == (n < 9)
    scale = x.double().abs() @ weight.double().abs().T
    rounding = 2**-8 if dtype == torch.bfloat16 else 0.0
    assert ((result.double() - exact).abs() <= rounding * exact.abs() + 2**-18 * scale).all()


@native_dtypes
@needs_onednn
def test_prepack_makes_both_copies_where_onednn_takes_large_row_counts(dtype, monkeypatch):
    monkeypatch.setattr(products, "MIN_PACKED_ELEMENTS", 16)
    weight = torch.randn(48, 64).to(dtype)
    for rows, copies in ((None, {"native"}), (9, {"native", "onednn"})):
        fresh = weight.clone()
        with onednn_from(dtype, rows):
            products.prepack(fresh)
        made = {
            name
            for name, table in (("native", products._PACKED_NATIVE), ("onednn", products._PACKED))
            if fresh in table
        }
        assert made == copies


def timed_kernels(monkeypatch, slow_native_from=None, slow_onednn_at=()):
    """A fake native kernel 0.2 ms slower a product from ``slow_native_from`` rows on, and a fake oneDNN product
    0.4 ms slower at ``slow_onednn_at``: where both are slow oneDNN is clearly the slower (equal delays left the
    2% rule to the machine's noise, and the test failed on a loaded host)."""

    def wait(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def native(x, packed, out_features, group):
        if slow_native_from is not None and x.shape[0] >= slow_native_from:
            wait(2e-4)

    def onednn(x, packed, bias, *args):
        if x.shape[0] in slow_onednn_at:
            wait(4e-4)

    monkeypatch.setattr(products, "TUNING_SHAPES", [(32, 8)] * 3)
    monkeypatch.setattr(products, "_LINEAR_POINTWISE", onednn)
    monkeypatch.delenv("SPECBOUND_ONEDNN_ROWS", raising=False)
    return native


@needs_onednn
@pytest.mark.parametrize(
    ("slow_native_from", "slow_onednn_at", "expected"),
    [
        (16, (9,), 16),  # oneDNN faster from 16 rows on
        (9, (), 9),
        (None, (9, 16, 32, 64), None),  # never faster
        (9, (16,), 32),  # faster at 9 but not at 16: only from 32 on does it stay faster
    ],
)
def test_onednn_takes_over_from_the_row_count_where_it_stays_faster(
    monkeypatch, slow_native_from, slow_onednn_at, expected
):
    native = timed_kernels(monkeypatch, slow_native_from, slow_onednn_at)
    assert products._onednn_from_rows(native, torch.float32, 4) == expected


@needs_onednn
def test_the_onednn_row_count_can_be_set_and_is_kept_for_this_cpu(monkeypatch, tmp_path):
    native = timed_kernels(monkeypatch, slow_native_from=16, slow_onednn_at=(9,))
    monkeypatch.setattr(products, "_cpuinfo", lambda: {"model name": "A", "flags": "avx512f"})
    cache = tmp_path / "rows.json"
    assert products._onednn_from_rows(native, torch.float32, 4, cache=cache) == 16
    never = timed_kernels(monkeypatch, slow_native_from=None, slow_onednn_at=(9, 16, 32, 64))
    assert products._onednn_from_rows(never, torch.float32, 4, cache=cache) == 16  # kept
    monkeypatch.setattr(products, "_cpuinfo", lambda: {"model name": "B", "flags": "avx512f"})
    assert products._onednn_from_rows(never, torch.float32, 4, cache=cache) is None  # another CPU
    assert products._onednn_from_rows(native, torch.float32, 4, cache=cache) is None  # None is kept too
    monkeypatch.setenv("SPECBOUND_ONEDNN_ROWS", "12")
    assert products._onednn_from_rows(never, torch.float32, 4) == 12
    monkeypatch.setenv("SPECBOUND_ONEDNN_ROWS", "never")
    assert products._onednn_from_rows(native, torch.float32, 4) is None
    for bad in ("1", "x", "-3"):
        monkeypatch.setenv("SPECBOUND_ONEDNN_ROWS", bad)
        with pytest.raises(ValueError, match="SPECBOUND_ONEDNN_ROWS must be an integer >= 2 or 'never'"):
            products._onednn_from_rows(native, torch.float32, 4)


def fake_kernel(slow_group, calls=None):
    """A kernel that records its group sizes in ``calls`` and takes 0.2 ms longer a product in ``slow_group``."""

    def operator(x, packed, out_features, group):
        if calls is not None:
            calls.append(group)
        if group == slow_group:
            end = time.perf_counter() + 2e-4
            while time.perf_counter() < end:
                pass

    return operator


def test_the_group_size_is_the_measured_faster_one_or_the_one_asked_for(monkeypatch):
    monkeypatch.setattr(products, "TUNING_SHAPES", [(32, 8)] * 3)
    monkeypatch.delenv("SPECBOUND_NATIVE_GROUP", raising=False)
    assert products._native_group(fake_kernel(4), torch.float32) == 6
    assert products._native_group(fake_kernel(6), torch.bfloat16) == 4
    monkeypatch.setenv("SPECBOUND_NATIVE_GROUP", "6")
    assert products._native_group(fake_kernel(6), torch.bfloat16) == 6
    monkeypatch.setenv("SPECBOUND_NATIVE_GROUP", "5")
    with pytest.raises(ValueError, match="SPECBOUND_NATIVE_GROUP must be one of"):
        products._native_group(fake_kernel(6), torch.bfloat16)


def test_the_measured_group_size_is_kept_for_this_cpu_only(monkeypatch, tmp_path):
    monkeypatch.setattr(products, "TUNING_SHAPES", [(32, 8)] * 3)
    monkeypatch.delenv("SPECBOUND_NATIVE_GROUP", raising=False)
    monkeypatch.setattr(products, "_cpuinfo", lambda: {"model name": "A", "flags": "avx512f"})
    cache, calls = tmp_path / "group.json", []
    assert products._native_group(fake_kernel(4, calls), torch.float32, cache=cache) == 6 and calls
    calls.clear()
    assert (
        products._native_group(fake_kernel(6, calls), torch.float32, cache=cache) == 6 and not calls
    )  # kept
    monkeypatch.setattr(products, "_cpuinfo", lambda: {"model name": "B", "flags": "avx512f"})
    assert (
        products._native_group(fake_kernel(6, calls), torch.float32, cache=cache) == 4 and calls
    )  # another CPU
    cache.write_text("not json")
    calls.clear()
    assert (
        products._native_group(fake_kernel(4, calls), torch.float32, cache=cache) == 6 and calls
    )  # unreadable


def test_the_native_kernels_can_be_turned_off():
    with products.switches(native=False):
        assert not products.native_available(torch.bfloat16) and not products.native_available(torch.float32)


@needs_onednn
def test_prepack_makes_the_copy_the_first_product_then_uses(monkeypatch):
    monkeypatch.setattr(products, "MIN_PACKED_ELEMENTS", 16)
    weight = torch.nn.Parameter(torch.randn(32, 16))  # requires grad: prepacking ignores the grad mode
    small = torch.randn(2, 4)
    products.prepack(weight, small)
    table = float32_copies()
    assert weight in table and small not in table  # a weight below MIN_PACKED_ELEMENTS is never packed
    made = table[weight][2]
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(products.product(x, weight), x @ weight.T, atol=1e-5, rtol=1e-5)
    assert table[weight][2] is made  # the first product found the copy and made no other


def test_prepack_packs_nothing_where_products_do_not_run_packed():
    weight = torch.randn(1024, 512)
    with products.switches(packed=False):
        products.prepack(weight)
    assert weight not in products._PACKED and weight not in products._PACKED_NATIVE


# The plan of a weight (products._Plan): product's per-call checks reduced to the weight's identity and key, the
# activations' dtype and device and the grad mode.


@pytest.fixture
def counted_checks(monkeypatch):
    """Weights of any size run packed; the list counts the full checks (packing_applies) products make."""
    monkeypatch.setattr(products, "MIN_PACKED_ELEMENTS", 0)
    calls = []
    original = products.packing_applies
    monkeypatch.setattr(products, "packing_applies", lambda x, w: calls.append(1) or original(x, w))
    return calls


@needs_onednn
@pytest.mark.parametrize("native", [True, False], ids=["native-where-it-runs", "onednn"])
def test_a_plan_replaces_the_checks_until_its_weight_changes(counted_checks, native):
    weight = torch.nn.Parameter(torch.randn(32, 16), requires_grad=False)
    x = torch.randn(3, 16)
    with torch.no_grad(), products.switches(native=native):
        for expected_checks in (1, 1, 1):  # the first product checks and plans, the others reuse the plan
            torch.testing.assert_close(products.product(x, weight), x @ weight.T, atol=1e-5, rtol=1e-5)
            assert len(counted_checks) == expected_checks
        weight.mul_(2)  # in place
        torch.testing.assert_close(products.product(x, weight), x @ weight.T, atol=1e-5, rtol=1e-5)
        weight.data = torch.randn(32, 16)  # new storage
        torch.testing.assert_close(products.product(x, weight), x @ weight.T, atol=1e-5, rtol=1e-5)
        assert len(counted_checks) == 3  # each change checked and planned again


def stale_plan_product(x, weight):
    """The product after ``weight`` doubled in place under a plan whose key was made current by hand."""
    with torch.no_grad():
        products.product(x, weight)
        weight.mul_(2)
        products._PLANS[id(weight)].key = products.tensor_key(weight)
        return products.product(x, weight)


@native_dtypes
def test_a_plan_that_missed_a_change_would_be_caught(dtype, monkeypatch):
    # Negative control for the test above: a plan made current by hand keeps the old copy.
    monkeypatch.setattr(products, "MIN_PACKED_ELEMENTS", 0)
    x, weight = native_operands(dtype, 2, 32, 16, seed=3)
    with torch.no_grad():
        before = products.product(x, weight)
    assert torch.equal(stale_plan_product(x, weight), before)


@needs_onednn
def test_a_plan_that_missed_a_change_would_be_caught_on_onednn(monkeypatch):
    monkeypatch.setattr(products, "MIN_PACKED_ELEMENTS", 0)
    weight, x = torch.randn(32, 16), torch.randn(3, 16)
    with torch.no_grad(), products.switches(native=False):
        before = products.product(x, weight)
        assert torch.equal(stale_plan_product(x, weight), before)


@needs_onednn
def test_a_plan_never_serves_autograd_or_a_switched_off_path(counted_checks, monkeypatch):
    weight = torch.nn.Parameter(torch.randn(32, 16))
    x = torch.randn(3, 16)
    with torch.no_grad():
        products.product(x, weight)
    assert id(weight) in products._PLANS
    products.product(x, weight).sum().backward()  # grad mode on: the checked path, F.linear
    torch.testing.assert_close(weight.grad, x.sum(0).expand(32, 16), atol=1e-5, rtol=1e-5)
    packed = []
    original = products._packed_linear_cpu
    monkeypatch.setattr(products, "_packed_linear_cpu", lambda *a: packed.append(1) or original(*a))
    with torch.no_grad():
        with products.switches(packed=False):
            assert not products._PLANS  # switching clears every plan
            products.product(x, weight)
        assert packed == []
        products.product(x, weight)
        assert packed == [1]  # the switch restored on exit


@needs_onednn
def test_a_plan_leaves_with_its_weight(counted_checks):
    weight = torch.randn(32, 16)
    with torch.no_grad():
        products.product(torch.randn(1, 16), weight)
    identity = id(weight)
    assert products._PLANS[identity].weight() is weight
    del weight
    gc.collect()
    assert identity not in products._PLANS


@needs_onednn
def test_a_weight_made_under_inference_mode_runs_packed_and_follows_a_new_tensor(counted_checks):
    # An inference tensor has no version counter: the key leaves it out rather than fail.
    with torch.inference_mode():
        weight, x = torch.randn(32, 16), torch.randn(3, 16)
        for _ in range(2):
            torch.testing.assert_close(products.product(x, weight), x @ weight.T, atol=1e-5, rtol=1e-5)
        assert len(counted_checks) == 1 and products._PLANS[id(weight)].key[1] is None
        other = torch.randn(32, 16)
        torch.testing.assert_close(products.product(x, other), x @ other.T, atol=1e-5, rtol=1e-5)
