"""The TokenReview cache is bounded: size (LRU), a TTL for known tokens and a shorter one for unknown."""

from __future__ import annotations

import contextlib

from sandfleet.gateway.auth import Authenticator, ReviewCache, Unauthenticated


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_least_recently_used_entry_goes_first() -> None:
    cache: ReviewCache[str, str] = ReviewCache(2, 30, 5, Clock())
    cache.put("a", "A")
    cache.put("b", "B")
    assert cache.get("a") == (True, "A")  # a is now the most recent
    cache.put("c", "C")
    assert len(cache) == 2
    assert cache.get("b") == (False, None)
    assert cache.get("a") == (True, "A")


def test_negative_results_expire_sooner_than_positive_ones() -> None:
    clock = Clock()
    cache: ReviewCache[str, str] = ReviewCache(10, 30, 5, clock)
    cache.put("known", "K")
    cache.put("unknown", None, negative=True)
    clock.now += 6
    assert cache.get("unknown") == (False, None)
    assert cache.get("known") == (True, "K")
    clock.now += 25
    assert cache.get("known") == (False, None)
    assert len(cache) == 0


async def test_a_flood_of_unknown_tokens_never_grows_the_cache_past_its_bound() -> None:
    reviews: list[str] = []

    async def review(token: str) -> tuple[str, list[str]] | None:
        reviews.append(token)
        return ("system:serviceaccount:ns:learner", ["system:serviceaccounts"]) if token == "good" else None

    authenticator = Authenticator(review_token=review, cache_size=50, clock=Clock())
    for i in range(1000):
        try:
            await authenticator.authenticate(f"Bearer unknown-{i}")
        except Unauthenticated:
            pass
        else:
            raise AssertionError("an unknown token was accepted")
    assert len(authenticator.token_cache) == 50
    assert (await authenticator.authenticate("Bearer good")).name == "system:serviceaccount:ns:learner"
    await authenticator.authenticate("Bearer good")
    assert reviews.count("good") == 1  # cached


async def test_a_refused_token_is_reviewed_again_after_the_negative_ttl() -> None:
    clock = Clock()
    valid: set[str] = set()

    async def review(token: str) -> tuple[str, list[str]] | None:
        return ("fresh", []) if token in valid else None

    authenticator = Authenticator(review_token=review, negative_cache_seconds=5, clock=clock)
    with contextlib.suppress(Unauthenticated):
        await authenticator.authenticate("Bearer minted-just-now")
    valid.add("minted-just-now")  # the token becomes valid (it was being created)
    clock.now += 6
    assert (await authenticator.authenticate("Bearer minted-just-now")).name == "fresh"
