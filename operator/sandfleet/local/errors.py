"""The local runtime's error type."""


class LocalRuntimeError(Exception):
    """Something the local runtime could not do; the message says what and why."""
