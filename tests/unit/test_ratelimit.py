"""Token buckets taking several tokens at once, and the continuously refilled bucket of the
ingest rate limit; times are plain numbers (no clock)."""

from __future__ import annotations

import pytest

from notifier.ratelimit import KeyedLimiter, RefillingBucket, TokenBucket


def test_a_refilling_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = RefillingBucket(capacity=3, rate=2.0)
    assert bucket.wait(0.0, 3) == 0.0
    bucket.take(0.0, 3)
    assert bucket.wait(0.0) == pytest.approx(0.5)  # one token back every 1/rate s
    assert bucket.wait(0.0, 2) == pytest.approx(1.0)
    assert bucket.wait(0.5) == 0.0
    bucket.take(0.5)
    assert bucket.wait(0.5) == pytest.approx(0.5)
    assert not bucket.full(1.0)
    assert bucket.full(10.0)  # never more than the capacity, however long it rests
    assert bucket.wait(10.0, 3) == 0.0
    bucket.take(10.0, 3)
    assert bucket.wait(10.0) == pytest.approx(0.5)


@pytest.mark.parametrize("make", [lambda: RefillingBucket(3, 1.0), lambda: TokenBucket(3, 1.0)])
def test_taking_more_than_is_free_or_than_the_capacity_is_refused(make: object) -> None:
    bucket = make()  # type: ignore[operator]
    with pytest.raises(ValueError, match="count must be from 1 to 3"):
        bucket.wait(0.0, 4)
    bucket.take(0.0, 2)
    with pytest.raises(RuntimeError):
        bucket.take(0.0, 2)


def test_a_sliding_log_bucket_takes_several_tokens_at_once() -> None:
    bucket = TokenBucket(3, 10.0)
    bucket.take(0.0, 2)
    bucket.take(4.0)
    assert bucket.wait(5.0, 2) == pytest.approx(5.0)  # both tokens of t=0 back at t=10
    assert bucket.wait(5.0, 3) == pytest.approx(9.0)  # and the one of t=4 at t=14
    assert bucket.wait(10.0, 2) == 0.0


def test_keyed_refilling_buckets_are_independent_and_forgotten_when_full() -> None:
    limiter: KeyedLimiter[str] = KeyedLimiter(lambda: RefillingBucket(2, 1.0))
    limiter.take("a", 0.0, 2)
    assert limiter.wait("a", 0.0) == pytest.approx(1.0)
    assert limiter.wait("b", 0.0, 2) == 0.0
    limiter.take("b", 0.5)
    assert len(limiter) == 2
    limiter.take("c", 5.0)  # a and b are full again by now: forgotten
    assert len(limiter) == 1
