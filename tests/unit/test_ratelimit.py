"""The rules of the shared buckets in Python (the SQL functions keep the same ones, see
tests/integration/test_rate_buckets.py): the window bucket (a sliding log) and the refilling
bucket of the ingest rate limit; times are plain numbers (no clock). And ``MemoryBuckets``, the
in-memory stand-in of the store, taking several buckets all or none."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from notifier.ratelimit import MAX_WINDOW_TOKENS, Bucket, RefillingBucket, Refusals, TokenBucket
from notifier.testing.buckets import MemoryBuckets


def test_a_refilling_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = RefillingBucket(capacity=3, rate=2.0)
    assert bucket.wait(0.0, 3) == 0.0
    bucket.take(0.0, 3)
    assert bucket.wait(0.0) == pytest.approx(0.5)  # one token back every 1/rate s
    assert bucket.wait(0.0, 2) == pytest.approx(1.0)
    assert bucket.wait(0.5) == 0.0
    bucket.take(0.5)
    assert bucket.wait(0.5) == pytest.approx(0.5)
    assert bucket.wait(10.0, 3) == 0.0  # never more than the capacity, however long it rests
    bucket.take(10.0, 3)
    assert bucket.wait(10.0) == pytest.approx(0.5)


def test_taking_more_than_the_capacity_or_than_is_there_is_refused() -> None:
    bucket = RefillingBucket(3, 1.0)
    with pytest.raises(ValueError, match="count must be from 1 to 3"):
        bucket.wait(0.0, 4)
    bucket.take(0.0, 2)
    with pytest.raises(RuntimeError):
        bucket.take(0.0, 2)
    window = TokenBucket(1, 1.0)
    window.take(0.0)
    with pytest.raises(RuntimeError):
        window.take(0.5)


def test_a_one_token_window_lets_one_through_per_period() -> None:
    bucket = TokenBucket(1, 1.0)
    assert bucket.wait(10.0) == 0.0
    bucket.take(10.0)
    assert bucket.wait(10.0) == 1.0
    assert bucket.wait(10.25) == 0.75
    assert bucket.wait(11.0) == 0.0
    bucket.take(11.0)
    assert bucket.wait(11.5) == 0.5


def test_a_window_never_lets_more_than_its_tokens_through_in_any_period() -> None:
    bucket = TokenBucket(30, 1.0)
    sent: list[float] = []
    now = 0.0
    while now < 5.0:  # someone asks every 10 ms
        if bucket.wait(now) == 0.0:
            bucket.take(now)
            sent.append(now)
        now = round(now + 0.01, 6)
    assert len(sent) == 30 * 5
    assert sent[:30] == [pytest.approx(i * 0.01) for i in range(30)]
    for start in sent:
        assert sum(1 for t in sent if start <= t < start + 1.0 - 1e-9) <= 30


def test_a_high_rate_keeps_a_small_window_of_the_same_rate() -> None:
    bucket = Bucket.per_second("k", 1000.0)
    assert bucket.tokens == MAX_WINDOW_TOKENS
    assert bucket.tokens / bucket.period == pytest.approx(1000.0)


@pytest.mark.parametrize("rate", [0.0, -1.0, float("inf")])
def test_a_bucket_needs_a_positive_finite_rate(rate: float) -> None:
    with pytest.raises(ValueError, match="rate"):
        Bucket.per_second("k", rate)


async def test_memory_buckets_take_all_or_none(mock_clock: trio.testing.MockClock) -> None:
    buckets = MemoryBuckets()
    a, b, c = Bucket("a", 1, 1.0), Bucket("b", 2, 1.0), Bucket("c", 1, 1.0)
    assert await buckets.take_tokens([a, b]) == 0.0
    assert await buckets.take_tokens([a, b]) == pytest.approx(1.0)  # a is empty
    assert await buckets.take_tokens([c, b]) == 0.0  # b kept the token a's refusal left it
    assert await buckets.take_tokens([c]) == pytest.approx(1.0)
    mock_clock.jump(1.0)
    assert await buckets.take_tokens([a, b, c]) == 0.0
    with pytest.raises(ValueError, match="twice"):
        await buckets.take_tokens([a, a])


async def test_memory_buckets_admit_from_a_refilling_bucket(
    mock_clock: trio.testing.MockClock,
) -> None:
    buckets = MemoryBuckets()
    assert await buckets.admit("t", 3, capacity=3, rate=2.0) == 0.0
    assert await buckets.admit("t", 1, capacity=3, rate=2.0) == pytest.approx(0.5)
    assert await buckets.admit("other", 3, capacity=3, rate=2.0) == 0.0  # its own bucket
    mock_clock.jump(0.5)
    assert await buckets.admit("t", 1, capacity=3, rate=2.0) == 0.0


def test_refusals_answer_until_their_time_then_forget() -> None:
    refusals = Refusals()
    chat, bot = Bucket("chat", 1, 1.0), Bucket("bot", 30, 1.0)
    assert refusals.wait((chat, bot), 10.0) == 0.0
    refusals.refused((chat, bot), 10.0, 0.75)
    assert refusals.wait((chat, bot), 10.5) == pytest.approx(0.25)
    assert refusals.wait((chat,), 10.5) == 0.0  # another set of buckets: ask the store
    assert refusals.wait((Bucket("chat", 2, 1.0), bot), 10.5) == 0.0  # other parameters too
    assert refusals.wait((chat, bot), 10.75) == 0.0
    assert len(refusals) == 0


def test_refusals_keep_their_memory_bounded() -> None:
    refusals = Refusals(max_entries=3)
    for n in range(3):
        refusals.refused((Bucket(f"k{n}", 1, 1.0),), 0.0, 1.0)
    refusals.refused((Bucket("late", 1, 1.0),), 0.5, 1.0)  # all still current: not kept
    assert len(refusals) == 3
    assert refusals.wait((Bucket("late", 1, 1.0),), 0.5) == 0.0
    refusals.refused((Bucket("later", 1, 1.0),), 2.0, 1.0)  # the others are past: forgotten
    assert len(refusals) == 1
