"""Who is calling and which pools they may lease from: static tokens and Kubernetes reviews."""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path


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
    ) -> None:
        self.static_tokens = static_tokens or {}
        self.review_token = review_token
        self.review_access = review_access
        self.anonymous_allowed = anonymous_allowed
        self.cache_seconds = cache_seconds
        # Reviews are apiserver round trips; caching keeps them off the lease hot path.
        self._token_cache: dict[str, tuple[float, Caller | None]] = {}
        self._access_cache: dict[tuple[str, str], tuple[float, bool]] = {}

    @classmethod
    def from_token_file(cls, path: Path | None, **kwargs: object) -> Authenticator:
        tokens = parse_token_file(path.read_text()) if path else {}
        return cls(static_tokens=tokens, **kwargs)  # type: ignore[arg-type]

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
            now = time.monotonic()
            cached = self._token_cache.get(token)
            if cached is None or cached[0] < now:
                reviewed = await self.review_token(token)
                found = Caller(reviewed[0], tuple(reviewed[1]), pools=None) if reviewed else None
                cached = (now + self.cache_seconds, found)
                self._token_cache[token] = cached
            if cached[1] is not None:
                return cached[1]
        raise Unauthenticated("the bearer token was not recognised")

    async def authorize(self, caller: Caller, pool: str) -> None:
        if caller.pools is not None:
            if "*" in caller.pools or pool in caller.pools:
                return
            raise NotAllowed(f"{caller.name} may not lease from pool {pool!r}")
        if self.review_access is None:
            raise NotAllowed(f"{caller.name} may not lease from pool {pool!r}")
        now = time.monotonic()
        key = (caller.name, pool)
        cached = self._access_cache.get(key)
        if cached is None or cached[0] < now:
            allowed = await self.review_access(caller.name, list(caller.groups), pool)
            cached = (now + self.cache_seconds, allowed)
            self._access_cache[key] = cached
        if not cached[1]:
            raise NotAllowed(
                f"{caller.name} may not lease from pool {pool!r}: grant the verb `use` on "
                f"sandboxpools/{pool} (group sandfleet.dev) with a Role"
            )
