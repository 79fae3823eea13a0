"""Per-sandbox agent tokens: derived from one fleet key, so only the key's holders can reach an agent.

Every sandbox's agent requires a bearer token. Storing one secret per sandbox would cost a write per
sandbox; instead each token is an HMAC of the sandbox's name under a fleet key that only the
creator of sandboxes (the operator, or the local runtime) and the gateway hold. A sandbox learns
its own token (it is in its agent's environment, which the sandbox user cannot read), and knowing
one token says nothing about any other sandbox's.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Final

# The environment variable the agent reads its token from (see sandfleet_agent.__main__).
AGENT_TOKEN_ENV: Final = "SANDFLEET_AGENT_TOKEN"
# Fleet keys are at least this many bytes; shorter ones are refused so a typo cannot weaken them.
MIN_KEY_BYTES: Final = 32
# Domain separation: the same key must never produce tokens for a different purpose.
_CONTEXT: Final = b"sandfleet agent token v1\x00"


class AgentKeyError(ValueError):
    """A fleet key that is missing or too short."""


def new_fleet_key() -> bytes:
    """A fresh random fleet key."""
    return secrets.token_bytes(MIN_KEY_BYTES)


def parse_fleet_key(text: str) -> bytes:
    """A fleet key from its text form (a file's content: hex, or any string of enough bytes)."""
    stripped = text.strip()
    try:
        key = bytes.fromhex(stripped)
    except ValueError:
        key = stripped.encode()
    if len(key) < MIN_KEY_BYTES:
        raise AgentKeyError(
            f"the agent key has {len(key)} bytes; it needs at least {MIN_KEY_BYTES} "
            "(make one with: python3 -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return key


def agent_token(key: bytes, sandbox_name: str) -> str:
    """The bearer token of the agent in sandbox `sandbox_name` (a Pod name, or a local sandbox id)."""
    return hmac.new(key, _CONTEXT + sandbox_name.encode(), hashlib.sha256).hexdigest()
