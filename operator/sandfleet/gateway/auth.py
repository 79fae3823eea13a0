"""Who is calling and which pools they may lease from: static tokens and Kubernetes reviews."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Unauthenticated(PermissionError):
    """No credentials, or credentials nobody recognises (401)."""


class NotAllowed(PermissionError):
    """A known caller asking for a pool it may not use (403)."""


@dataclass(frozen=True)
class Caller:
    """An authenticated caller; `pools` None means "ask RBAC" (Kubernetes identities)."""

    name: str
    groups: tuple[str, ...] = ()
    pools: frozenset[str] | None = frozenset({"*"})


ANONYMOUS = Caller("anonymous")


def parse_token_file(text: str) -> dict[str, Caller]:
    """Tokens from lines `TOKEN NAME [POOL,POOL|*]` (`#` comments); pools default to all."""
    tokens: dict[str, Caller] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) not in (2, 3):
            raise ValueError(f"token file line {number}: expected `TOKEN NAME [POOLS]`, got {raw!r}")
        pools = frozenset(fields[2].split(",")) if len(fields) == 3 else frozenset({"*"})
        tokens[fields[0]] = Caller(fields[1], pools=pools)
    return tokens


class ReviewCache(Generic[K, V]):
    """Review results, bounded: at most `max_size` (least recently used go first), each for a TTL.

    Negative results live shorter than positive ones: a token minted a moment ago must not stay
    refused for long, and a flood of unknown tokens only ever costs `max_size` entries.
    """

    def __init__(
        self,
        max_size: int,
        ttl_seconds: float,
        negative_ttl_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_size < 1:
            raise ValueError(f"a review cache needs room for at least one entry, got {max_size}")
        self.max_size = max_size
        self.ttl_seconds = ttl_seconds
        self.negative_ttl_seconds = negative_ttl_seconds
        self.clock = clock
        self._entries: OrderedDict[K, tuple[float, V | None]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> tuple[bool, V | None]:
        """(found, value): an expired entry is dropped and not found."""
        entry = self._entries.get(key)
        if entry is None:
            return False, None
        if entry[0] <= self.clock():
            del self._entries[key]
            return False, None
        self._entries.move_to_end(key)
        return True, entry[1]

    def put(self, key: K, value: V | None, negative: bool = False) -> None:
        """Remember `value` (`negative`: a refusal, kept for the shorter TTL)."""
        ttl = self.negative_ttl_seconds if negative else self.ttl_seconds
        if ttl <= 0:
            self._entries.pop(key, None)
            return
        self._entries[key] = (self.clock() + ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_size:
            self._entries.popitem(last=False)


def token_digest(token: str) -> bytes:
    """What the cache keys a token by: never the token itself, which a heap dump would show."""
    return hashlib.sha256(token.encode()).digest()


TokenReviewer = Callable[[str], Awaitable[tuple[str, list[str]] | None]]
AccessReviewer = Callable[[str, list[str], str], Awaitable[bool]]


class Authenticator:
    """Turns an Authorization header into a Caller, and answers whether it may use a pool."""

    def __init__(
        self,
        static_tokens: dict[str, Caller] | None = None,
        review_token: TokenReviewer | None = None,
        review_access: AccessReviewer | None = None,
        anonymous_allowed: bool = False,
        cache_seconds: float = 30.0,
        negative_cache_seconds: float = 5.0,
        cache_size: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.static_tokens = static_tokens or {}
        self.review_token = review_token
        self.review_access = review_access
        self.anonymous_allowed = anonymous_allowed
        # Reviews are apiserver round trips; caching keeps them off the lease hot path. Both caches
        # are bounded: a caller sending a new random token per request must not grow the gateway.
        self.token_cache: ReviewCache[bytes, Caller] = ReviewCache(
            cache_size, cache_seconds, negative_cache_seconds, clock
        )
        self.access_cache: ReviewCache[tuple[str, str], bool] = ReviewCache(
            cache_size, cache_seconds, negative_cache_seconds, clock
        )

    async def authenticate(self, authorization: str | None) -> Caller:
        if not authorization:
            if self.anonymous_allowed:
                return ANONYMOUS
            raise Unauthenticated("no bearer token: send `Authorization: Bearer <token>`")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the Authorization header must be `Bearer <token>`")
        token = token.strip()
        for known, caller in self.static_tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return caller
        if self.review_token is not None:
            key = token_digest(token)
            cached, found = self.token_cache.get(key)
            if not cached:
                reviewed = await self.review_token(token)
                found = Caller(reviewed[0], tuple(reviewed[1]), pools=None) if reviewed else None
                self.token_cache.put(key, found, negative=found is None)
            if found is not None:
                return found
        raise Unauthenticated("the bearer token was not recognised")

    async def authorize(self, caller: Caller, pool: str) -> None:
        if caller.pools is not None:
            if "*" in caller.pools or pool in caller.pools:
                return
            raise NotAllowed(f"{caller.name} may not lease from pool {pool!r}")
        if self.review_access is None:
            raise NotAllowed(f"{caller.name} may not lease from pool {pool!r}")
        key = (caller.name, pool)
        known, allowed = self.access_cache.get(key)
        if not known:
            allowed = await self.review_access(caller.name, list(caller.groups), pool)
            self.access_cache.put(key, allowed, negative=not allowed)
        if not allowed:
            raise NotAllowed(
                f"{caller.name} may not lease from pool {pool!r}: grant the verb `use` on "
                f"sandboxpools/{pool} (group sandfleet.dev) with a Role"
            )
