"""GCRA, pure: exact arithmetic, the burst convention, and its guarantees over any request sequence."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from limits.gcra import Limit, charge, limit_problems

T0 = 1_800_000_000_000_000


def test_increment_is_one_over_rate_in_microseconds():
    assert Limit(rate=10, burst=5).increment_us == 100_000
    assert Limit(rate=0.5, burst=1).increment_us == 2_000_000


def test_capacity_is_burst_increments():
    assert Limit(rate=10, burst=5).capacity_us == 500_000


def test_cost_is_rounded_up_and_exact_for_decimal_rates():
    assert Limit(rate=3, burst=1).cost_us(1) == 333_334
    # 0.1 as a float is 0.1000000000000000055...; the operator meant one tenth.
    assert Limit(rate=0.1, burst=1).cost_us(1) == 10_000_000
    assert Limit(rate=10_000_000, burst=1000).cost_us(1) == 1
    assert Limit(rate=10_000_000, burst=1000).cost_us(15) == 2


def test_a_full_bucket_admits_the_whole_burst_at_once_and_no_more():
    limit = Limit(rate=1, burst=3)
    tat = None
    for _ in range(3):
        verdict = charge([tat], [(limit.increment_us, limit.capacity_us)], T0)
        assert verdict.admitted
        tat = verdict.tats[0]
    verdict = charge([tat], [(limit.increment_us, limit.capacity_us)], T0)
    assert not verdict.admitted
    assert verdict.retry_after_ms == 1000


def test_a_denial_leaves_the_tats_as_they_were():
    verdict = charge([T0 + 500, None], [(100, 400), (100, 400)], T0)
    assert verdict == charge([T0 + 500, None], [(100, 400), (100, 400)], T0)
    assert not verdict.admitted
    assert verdict.tats == (T0 + 500, T0)
    assert verdict.retry_after_ms == 1  # 200 µs rounded up


def test_charges_are_all_or_nothing_and_the_wait_is_the_longest():
    verdict = charge([T0 + 2_500_000, T0 + 9_000_000], [(1_000_000, 3_000_000), (1_000_000, 5_000_000)], T0)
    assert not verdict.admitted
    assert verdict.retry_after_ms == 5000


def test_a_charge_larger_than_the_capacity_exceeds_rather_than_waits():
    verdict = charge([None, None], [(100, 1000), (1001, 1000)], T0)
    assert not verdict.admitted
    assert verdict.exceeds == 1


@pytest.mark.parametrize(
    ("rate", "burst", "field", "message"),
    [
        (0, 1, "rate", "must be greater than 0."),
        (-1, 1, "rate", "must be greater than 0."),
        (float("nan"), 1, "rate", "must be a number of units per second."),
        ("5", 1, "rate", "must be a number of units per second."),
        (1e10, 1, "rate", "must be at most 1000000000 per second."),
        (1, 0, "burst", "must be at least 1."),
        (1, 1.5, "burst", "must be a whole number."),
        (True, 1, "rate", "must be a number of units per second."),
        (0.000001, 100, "burst", "burst / rate (the refill time) must be at most one year."),
    ],
)
def test_limit_problems_name_the_field(rate, burst, field, message):
    assert limit_problems(rate, burst) == {field: message}


def test_a_fractional_rate_is_a_limit():
    assert limit_problems(0.5, 1) == {}


def test_remaining_counts_whole_units_left_in_the_bucket():
    limit = Limit(rate=10, burst=50)
    assert limit.remaining(0) == 50
    assert limit.remaining(100_000) == 49
    assert limit.remaining(150_000) == 48
    assert limit.remaining(limit.capacity_us) == 0


limits = st.builds(
    Limit,
    rate=st.sampled_from([0.5, 1, 3, 7.5, 10, 100, 1000]),
    burst=st.integers(min_value=1, max_value=20),
)
# Gaps between requests in µs: bursts of simultaneous requests and irregular waits.
gaps = st.lists(st.integers(min_value=0, max_value=3_000_000), min_size=1, max_size=120)


def run(limit: Limit, gaps_us: list[int], units: int = 1):
    """Feed requests at the given gaps; returns [(time, admitted, verdict, tat_before)]."""
    now, tat, out = T0, None, []
    for gap in gaps_us:
        now += gap
        verdict = charge([tat], [(limit.cost_us(units), limit.capacity_us)], now)
        out.append((now, verdict.admitted, verdict, tat))
        if verdict.admitted:
            tat = verdict.tats[0]
    return out


@settings(max_examples=300, deadline=None)
@given(limit=limits, gaps_us=gaps, window_us=st.integers(min_value=0, max_value=20_000_000))
def test_admitted_in_any_window_never_exceeds_burst_plus_rate_times_window(limit, gaps_us, window_us):
    admitted_at = [now for now, admitted, _, _ in run(limit, gaps_us) if admitted]
    for start in admitted_at:
        in_window = sum(1 for t in admitted_at if start <= t <= start + window_us)
        assert in_window <= limit.burst + limit.rate * window_us / 1_000_000


@settings(max_examples=300, deadline=None)
@given(limit=limits, gaps_us=gaps)
def test_a_request_is_admitted_whenever_the_bucket_is_full(limit, gaps_us):
    for now, admitted, _, tat in run(limit, gaps_us):
        if tat is None or tat <= now:
            assert admitted


@settings(max_examples=300, deadline=None)
@given(limit=limits, gaps_us=gaps, units=st.integers(min_value=1, max_value=4))
def test_retry_after_is_exact(limit, gaps_us, units):
    cost = (limit.cost_us(units), limit.capacity_us)
    for now, admitted, verdict, tat in run(limit, gaps_us, units):
        if admitted or verdict.exceeds is not None:
            continue
        wait_us = verdict.retry_after_ms * 1000
        assert charge([tat], [cost], now + wait_us).admitted
        assert not charge([tat], [cost], now + wait_us - 1000).admitted
