"""The `Allow` header of a 405: every method some route of the requested path accepts."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.routing import BaseRoute, Match, Route
from starlette.types import Scope


def allowed_methods(routes: Iterable[BaseRoute], scope: Scope) -> str:
    """The methods the routes matching `scope`'s path accept, sorted, for an `Allow` header.

    Starlette names only the first matching route's methods, but one path here is served by
    several routes (GET, PUT and DELETE on files are separate routes), so all are gathered.
    """
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.methods and route.matches(scope)[0] != Match.NONE:
            methods.update(route.methods)
    return ", ".join(sorted(methods))
