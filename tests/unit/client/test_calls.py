"""The bodies the client builds are sandfleet.wire's: only its fields, and the key the client made itself."""

from __future__ import annotations

from typing import Any

from sandfleet.client import SpanReport
from sandfleet.client.calls import acquire_call, exec_body, profile_call, publish_call, spans_call
from sandfleet.wire import AcquireBody, ExecBody, ProfileQuery, PublishPolicyBody, SpanBody, SpansBody


def fields(shape: Any) -> frozenset[str]:
    """A TypedDict's keys, required or not."""
    return frozenset(shape.__required_keys__ | shape.__optional_keys__)


def test_an_acquire_sends_a_key_of_its_own_and_says_it_is_fresh() -> None:
    call = acquire_call("python", 2, ["eu"], None, {"run": "r1"}, None, 5.0, None)
    body: AcquireBody = call.json
    assert set(body) == {"pool", "count", "regions", "labels", "wait_seconds", "idempotency_key"}
    assert body["idempotency_key"]
    assert (call.method, call.path, call.retry, call.fresh_key) == ("POST", "/v1/leases", True, True)
    keyed = acquire_call("python", 4, (), 60, None, 3, 5.0, "episode-7", image="task:1", min_count=2)
    assert set(keyed.json) == fields(AcquireBody)  # every field, when every option is given
    assert (keyed.json["idempotency_key"], keyed.fresh_key) == ("episode-7", False)


def test_exec_takes_argv_or_shell_and_only_the_options_given() -> None:
    assert exec_body(["echo", "hi"], None, None, None, None) == {"argv": ["echo", "hi"]}
    body = exec_body("echo hi", {"A": "1"}, "/w", "in", 2.0, 10, "base64")
    assert set(body) == fields(ExecBody) - {"argv", "stdin_base64"}
    assert body["shell"] == "echo hi"


def test_the_run_calls_send_wires_bodies() -> None:
    published = publish_call("r1", 3, 2, "flag")
    assert set(published.json) == fields(PublishPolicyBody)
    assert publish_call("r1", 3, None, None).json == {"version": 3}
    spans = spans_call("r1", [SpanReport("train", 1.0, 2.0, "learner", "learner")], 1)
    assert set(spans.json) == fields(SpansBody)
    assert set(spans.json["spans"][0]) == fields(SpanBody)
    assert set(profile_call("r1", 60.0).params) == fields(ProfileQuery)
