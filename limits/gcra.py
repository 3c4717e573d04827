"""GCRA, the generic cell rate algorithm: a whole token bucket in one number. Pure: time is an argument.

A bucket is its *theoretical arrival time* (TAT), in microseconds: the instant at which the
bucket would be full again if nothing more arrived. A limit is a ``rate`` (units per second,
fractional allowed: 0.5 is one every two seconds) and a ``burst`` (a whole number ≥ 1).

* ``increment`` = 1/rate seconds per unit, in µs. A charge of ``n`` units costs
  ``ceil(n × increment)`` µs: rounded **up**, so rounding never admits more than the rate.
* ``capacity`` = the cost of ``burst`` units. **Burst convention**: ``burst`` is how many units a
  full bucket takes at the same instant (burst 50 admits 50 hooks at once, the 51st waits one
  increment). The literature's tolerance τ is ``capacity - increment``.
* A charge is admitted when ``max(tat, now) + cost - now <= capacity``; the bucket's TAT becomes
  ``max(tat, now) + cost``. A denied charge writes nothing and waits
  ``retry_after_ms = ceil((new_tat - capacity - now) / 1000)``: waiting exactly that long admits
  it, one millisecond less does not.
* A charge whose cost exceeds the whole capacity (more units than ``burst``) can never pass and is
  refused as *exceeds* rather than told to retry.

Because ``ceil(burst × increment) <= burst × ceil(increment)``, the number of admitted units in
any window ``W`` never exceeds ``burst + rate × W`` (tests/limits/test_gcra.py proves it over random
request sequences). Every quantity is an integer (µs) so the Lua twin in ``limits.store.redis``
computes exactly the same answers; a microsecond TAT stays exact in a double until the year 2255.

This module does not know tenants, kinds or stores: ``limits.admission`` builds the charges and
the stores keep the TATs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

US_PER_S = 1_000_000

# A rate above this costs less than a microsecond per unit even for the smallest charge: the
# limit would be meaningless, so validation refuses it.
MAX_RATE = 1e9
# A window (burst / rate, the time a full bucket takes to refill) longer than a year is a typo, and
# keeps TAT + capacity far inside the 2^53 µs a double holds exactly.
MAX_WINDOW_S = 366 * 24 * 3600


@dataclass(frozen=True)
class Limit:
    """``rate`` units per second with a ``burst`` of units at once."""

    rate: float
    burst: int

    def __post_init__(self):
        problems = limit_problems(self.rate, self.burst)
        if problems:
            raise ValueError("; ".join(f"{field}: {message}" for field, message in problems.items()))

    def cost_us(self, units: int) -> int:
        """What ``units`` cost, in µs: ``ceil(units × 1e6 / rate)``, exact (no float rounding)."""
        exact = Fraction(repr(self.rate))  # the decimal the operator typed: 0.1, not 0.1000000000000000055
        return -((-units * US_PER_S * exact.denominator) // exact.numerator)

    @property
    def increment_us(self) -> int:
        return self.cost_us(1)

    @property
    def capacity_us(self) -> int:
        return self.cost_us(self.burst)

    @property
    def window_s(self) -> float:
        """Seconds an empty bucket takes to become full again (``burst / rate``)."""
        return self.burst / self.rate

    def remaining(self, debt_us: int) -> int:
        """Units a bucket that is ``debt_us`` ahead of now still admits at once."""
        room = self.capacity_us - max(0, debt_us)
        return max(0, min(self.burst, int(Fraction(room) * Fraction(repr(self.rate)) / US_PER_S)))


def limit_problems(rate, burst) -> dict[str, str]:
    """Why ``rate``/``burst`` is not a limit, by field name (empty when it is one)."""
    problems = {}
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate):
        problems["rate"] = "must be a number of units per second."
    elif rate <= 0:
        problems["rate"] = "must be greater than 0."
    elif rate > MAX_RATE:
        problems["rate"] = f"must be at most {MAX_RATE:.0f} per second."
    if isinstance(burst, bool) or not isinstance(burst, int):
        problems["burst"] = "must be a whole number."
    elif burst < 1:
        problems["burst"] = "must be at least 1."
    if not problems and burst / rate > MAX_WINDOW_S:
        problems["burst"] = "burst / rate (the refill time) must be at most one year."
    return problems


@dataclass(frozen=True)
class Verdict:
    """The answer for a set of charges: admitted (with each bucket's new TAT) or not (and for how long)."""

    admitted: bool
    tats: tuple[int, ...]  # the TAT each bucket has after the call (unchanged when denied)
    retry_after_ms: int = 0
    exceeds: int | None = None  # index of the charge larger than its bucket's whole capacity


def charge(tats: list[int | None], costs: list[tuple[int, int]], now_us: int) -> Verdict:
    """Charge ``costs[i] = (cost_us, capacity_us)`` against the bucket whose TAT is ``tats[i]``.

    All or nothing: when any charge is denied nothing is taken and ``retry_after_ms`` is the
    longest wait. ``None`` is a bucket never charged (or forgotten): it is full. Each entry is a
    different bucket (the stores refuse a call that names one twice).
    """
    for index, (cost, capacity) in enumerate(costs):
        if cost > capacity:
            return Verdict(False, tuple(now_us if t is None else t for t in tats), exceeds=index)
    new_tats = []
    wait_us = 0
    for tat, (cost, capacity) in zip(tats, costs, strict=True):
        new_tat = (now_us if tat is None else max(tat, now_us)) + cost
        wait_us = max(wait_us, new_tat - capacity - now_us)
        new_tats.append(new_tat)
    if wait_us > 0:
        return Verdict(False, tuple(now_us if t is None else t for t in tats), -(-wait_us // 1000))
    return Verdict(True, tuple(new_tats))
