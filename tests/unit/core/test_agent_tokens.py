"""Per-sandbox agent tokens: distinct per sandbox and per key, stable, and refused for weak keys."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandfleet.core.agent_tokens import AgentKeyError, agent_token, new_fleet_key, parse_fleet_key


def test_a_token_is_stable_for_one_key_and_sandbox() -> None:
    key = new_fleet_key()
    assert agent_token(key, "pool-a-x1") == agent_token(key, "pool-a-x1")


@given(st.text(min_size=1, max_size=60), st.text(min_size=1, max_size=60))
def test_two_sandboxes_never_share_a_token(first: str, second: str) -> None:
    key = b"k" * 32
    assert (agent_token(key, first) == agent_token(key, second)) == (first == second)


def test_another_key_gives_another_token() -> None:
    assert agent_token(new_fleet_key(), "s") != agent_token(new_fleet_key(), "s")


def test_keys_parse_from_hex_or_text() -> None:
    assert parse_fleet_key("ab" * 32 + "\n") == bytes.fromhex("ab" * 32)
    assert parse_fleet_key("x" * 40) == b"x" * 40


def test_a_short_key_is_refused_with_the_way_to_make_one() -> None:
    with pytest.raises(AgentKeyError, match=r"at least 32.*token_hex"):
        parse_fleet_key("short")
