"""The E2B translation: templates, timeouts, credentials, process events, file entries, uploads."""

from __future__ import annotations

import base64
import os
import stat
import urllib.parse

import httpx
import pytest

from sandfleet.core import e2b


def test_a_template_names_a_pool_or_an_image() -> None:
    assert e2b.template_choice("python", ["python", "node"]) == e2b.E2BTemplate("python", pool="python")
    image = "registry.local/task:v1"
    assert e2b.template_choice(image, ["python"]) == e2b.E2BTemplate(image, image=image)
    digest = "task@sha256:" + "0" * 64
    assert e2b.template_choice(digest, []).image == digest
    # A local layout is leased by its bare tag: an image when the pools serve it and no pool is so named.
    assert e2b.template_choice("busybox", ["python"], {"sandfleet", "busybox"}).image == "busybox"
    assert e2b.template_choice("python", ["python"], {"python"}).pool == "python"
    assert e2b.template_choice("busybox", ["python"]).pool == "busybox"


def test_the_sdk_default_template_is_the_only_pool_or_refused() -> None:
    assert e2b.template_choice(None, ["python"]).pool == "python"
    assert e2b.template_choice(e2b.SDK_DEFAULT_TEMPLATE, ["python"]).pool == "python"
    assert e2b.template_choice("base", ["base", "python"]).pool == "base"
    with pytest.raises(e2b.E2BRequestError, match="ambiguous") as refused:
        e2b.template_choice(None, ["python", "node"])
    assert refused.value.status == 400
    assert "node, python" in str(refused.value)


def test_timeouts_become_lease_ttls_within_bounds() -> None:
    assert e2b.lease_ttl(None) is None
    assert e2b.lease_ttl(1) == 1
    assert e2b.lease_ttl(e2b.MAX_TIMEOUT_S) == e2b.MAX_TIMEOUT_S
    for bad in (0, -5, e2b.MAX_TIMEOUT_S + 1, 1.5, "60", True):
        with pytest.raises(e2b.E2BRequestError):
            e2b.lease_ttl(bad)


def test_a_create_body_becomes_an_acquire_body() -> None:
    body = {"templateID": "python", "timeout": 90, "metadata": {"run": "r1", "episode": "7"}, "envVars": {}}
    assert e2b.acquire_body(body, ["python"]) == {
        "pool": "python",
        "ttl_seconds": 90,
        "labels": {"run": "r1", "episode": "7", e2b.TEMPLATE_LABEL: "python"},
    }
    image = e2b.acquire_body({"templateID": "reg/x:1"}, [])
    assert image["image"] == "reg/x:1"
    assert "pool" not in image
    with pytest.raises(e2b.E2BRequestError, match=r"envs to each commands\.run"):
        e2b.acquire_body({"templateID": "python", "envVars": {"A": "1"}}, ["python"])
    with pytest.raises(e2b.E2BRequestError, match="metadata"):
        e2b.acquire_body({"templateID": "python", "metadata": {"a": 1}}, ["python"])
    with pytest.raises(e2b.E2BRequestError, match="templateID"):
        e2b.acquire_body({"templateID": 3}, ["python"])


def test_created_and_detail_answer_the_sdk_fields() -> None:
    answer = e2b.created("lease-1", "python", "actor-0", "tok")
    assert answer["sandboxID"] == "lease-1"
    assert answer["envdAccessToken"] == "tok"
    assert answer["envdVersion"] == e2b.ENVD_VERSION
    info = e2b.detail("lease-1", "python", "actor-0", 0.0, 90.5, {"run": "r", e2b.TEMPLATE_LABEL: "python"})
    assert info["startedAt"] == "1970-01-01T00:00:00Z"
    assert info["endAt"] == "1970-01-01T00:01:30.500000Z"
    assert info["metadata"] == {"run": "r"}
    assert info["state"] == "running"


def test_the_sdk_credentials_become_a_bearer_token_on_e2b_paths_only() -> None:
    headers = {"x-api-key": "k1", "x-access-token": "k2", "authorization": "Basic dXNlcjo="}
    assert e2b.bearer(e2b.API_PREFIX + "/sandboxes", headers) == "k1"
    assert e2b.bearer(e2b.ENVD_PREFIX + "/files", headers) == "k2"
    assert e2b.bearer("/v1/leases", headers) is None
    assert e2b.bearer(e2b.ENVD_PREFIX + "/files", {"x-api-key": "k1"}) is None
    assert e2b.bearer(e2b.API_PREFIX + "/sandboxes", {"x-api-key": ""}) is None


def test_an_exec_request_keeps_argv_env_cwd_and_the_deadline() -> None:
    body = e2b.exec_request("/bin/bash", ["-l", "-c", "echo hi"], {"A": "1"}, "src", 1500)
    assert body == {
        "argv": ["/bin/bash", "-l", "-c", "echo hi"],
        "timeout_s": 1.5,
        "encoding": "base64",
        "env": {"A": "1"},
        "cwd": "src",
    }
    unbounded = e2b.exec_request("true", [], {}, None, None)
    assert unbounded["timeout_s"] == e2b.UNBOUNDED_COMMAND_S
    assert "env" not in unbounded
    assert "cwd" not in unbounded
    with pytest.raises(e2b.E2BRequestError):
        e2b.exec_request("", [], {}, None, None)


def test_agent_events_become_process_events() -> None:
    raw = os.urandom(64)
    assert e2b.process_event({"event": "start", "pid": 42}) == e2b.Started(42)
    assert e2b.process_event({"event": "start", "pid": None}) == e2b.Started(0)
    encoded = base64.b64encode(raw).decode()
    assert e2b.process_event({"event": "stderr", "data": encoded}) == e2b.Output("stderr", raw)
    assert e2b.process_event({"event": "stdout", "data": ""}) is None
    assert e2b.process_event({"event": "unknown"}) is None
    done = e2b.process_event({"event": "exit", "exit_code": 3, "signal": None, "timed_out": False})
    assert done == e2b.Ended(exit_code=3, exited=True, status="exit status 3", error=None)


def test_a_killed_or_timed_out_command_ends_as_envd_says() -> None:
    killed = e2b.ended({"exit_code": 137, "signal": 9, "timed_out": True, "duration_s": 2.0})
    assert not killed.exited
    assert killed.status == "signal: 9"
    assert killed.error is not None
    assert "timed out" in killed.error
    assert e2b.ended({}).exit_code == -1


def test_agent_entries_become_entry_infos() -> None:
    entry = {"name": "a.py", "path": "src/a.py", "type": "file", "size": 12, "mode": "0644", "mtime": 1.5}
    info = e2b.entry_info(entry)
    assert info is not None
    assert info["path"] == "/workspace/src/a.py"
    assert info["mode"] == 0o644
    assert info["permissions"] == stat.filemode(stat.S_IFREG | 0o644)
    link = e2b.entry_info({"name": "l", "path": "l", "type": "symlink", "mode": "0777", "target": "a"})
    assert link is not None
    assert link["is_symlink"]
    assert link["symlink_target"] == "a"
    assert e2b.entry_info({"name": "p", "path": "p", "type": "other", "mode": "0600"}) is None
    assert e2b.absolute(".") == e2b.WORKSPACE
    assert e2b.absolute("../tests/x") == "/tests/x"


def test_listing_depth() -> None:
    assert not e2b.list_depth(0)
    assert not e2b.list_depth(1)
    assert e2b.list_depth(2)
    with pytest.raises(e2b.E2BRequestError):
        e2b.list_depth(-1)
    assert e2b.within_depth("/workspace", "/workspace/a", 1)
    assert not e2b.within_depth("/workspace", "/workspace/a/b", 1)
    assert e2b.within_depth("/workspace", "/workspace/a/b", 2)
    assert e2b.within_depth("/workspace", "/workspace/a/b/c/d", 0)


def test_uploads_from_the_sdks_own_multipart_and_octet_stream_bodies() -> None:
    blob = os.urandom(300) + b"\r\n--boundary-like\r\n"
    # the body httpx (the SDK's HTTP layer) builds for files=[("file", (path, data))]
    built = httpx.Request(
        "POST", "http://x/files", files=[("file", ("/workspace/a.bin", blob)), ("file", ("b.txt", b"text"))]
    )
    body = built.read()
    content_type = built.headers["content-type"]
    assert e2b.uploads(content_type, body, None) == [("/workspace/a.bin", blob), ("b.txt", b"text")]
    single = httpx.Request("POST", "http://x/files", files=[("file", ("ignored", blob))])
    assert e2b.uploads(single.headers["content-type"], single.read(), "dest.bin") == [("dest.bin", blob)]
    assert e2b.uploads("application/octet-stream", blob, "o.bin") == [("o.bin", blob)]
    with pytest.raises(e2b.E2BRequestError, match="path"):
        e2b.uploads("application/octet-stream", blob, None)
    assert e2b.octet_stream_path("dir/o.bin") == "dir/o.bin"
    for missing in (None, ""):
        with pytest.raises(e2b.E2BRequestError, match="path query parameter is required") as refused:
            e2b.octet_stream_path(missing)
        assert refused.value.status == 400
    for plain in ("", "identity", " Identity "):
        e2b.check_encoding(plain)
    for encoded in ("gzip", "br", "gzip, identity"):
        with pytest.raises(e2b.E2BRequestError, match="write without gzip") as refused:
            e2b.check_encoding(encoded)
        assert refused.value.status == 415


def test_write_info_and_error_codes() -> None:
    assert e2b.write_info("notes/a.txt") == {
        "name": "a.txt",
        "type": "file",
        "path": "/workspace/notes/a.txt",
    }
    assert e2b.api_error(404, "gone") == {"code": 404, "message": "gone"}
    assert e2b.connect_code(404, "file_not_found") == "not_found"
    assert e2b.connect_code(403) == "permission_denied"
    assert e2b.connect_code(418) == "internal"


def test_list_filters_as_the_sdk_sends_them() -> None:
    wanted = {"episode": "a b/c", "run": "r&1"}
    # the SDK's own encoding (e2b.sandbox_sync.paginator): each key and value quoted, then url-encoded
    sent = urllib.parse.urlencode({urllib.parse.quote(k): urllib.parse.quote(v) for k, v in wanted.items()})
    assert e2b.metadata_filter(sent) == wanted
    assert e2b.metadata_filter(None) == {}
    labels = {**wanted, e2b.TEMPLATE_LABEL: "python", "other": "x"}
    assert e2b.listed(labels, wanted, [], "")
    assert e2b.listed(labels, {}, ["running", "paused"], "python")
    assert not e2b.listed(labels, {"episode": "other"}, [], "")
    assert not e2b.listed(labels, {}, ["paused"], "")
    assert not e2b.listed(labels, {}, [], "node")


def test_the_sdks_bash_form_falls_back_to_sh_and_nothing_else_does() -> None:
    body = e2b.exec_request("/bin/bash", ["-l", "-c", "echo $PATH"], {"A": "1"}, "/srv", None)
    again = e2b.without_bash(body)
    assert again is not None
    assert again["argv"] == ["/bin/sh", "-l", "-c", "echo $PATH"]
    assert {k: v for k, v in again.items() if k != "argv"} == {k: v for k, v in body.items() if k != "argv"}
    assert e2b.without_bash(e2b.exec_request("/bin/bash", ["-c", "x"], {}, None, None)) is None
    assert e2b.without_bash(e2b.exec_request("python3", ["-l", "-c", "x"], {}, None, None)) is None
