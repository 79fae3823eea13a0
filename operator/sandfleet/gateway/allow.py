"""The `Allow` header of a 405: every method some route of the requested path accepts."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.routing import BaseRoute, Match
from starlette.types import Scope

# The methods a route can declare (RFC 9110, and PATCH): each is tried against the routes.
METHODS = ("CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE")


def allowed_methods(routes: Iterable[BaseRoute], scope: Scope) -> str:
    """The methods the routes matching `scope`'s path accept, sorted, for an `Allow` header.

    Starlette names only the first matching route's methods, but one path here is served by
    several routes (GET, PUT and DELETE on files are separate routes), so all are gathered. Each
    method is tried through `matches`, so routes inside included routers answer for themselves.
    """
    routes = list(routes)
    allowed = []
    for method in METHODS:
        probe = {**scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in routes):
            allowed.append(method)
    return ", ".join(allowed)
