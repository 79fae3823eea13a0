"""Operator settings, from flags or SANDFLEET_* environment variables (pydantic-settings).

The one home of the operator's configuration, as `gateway/settings.py` is the gateway's: what each
setting is, its default, its bounds and the variable it is read from. `sandfleet operator`
(`cli/operator_commands.py`) passes only the flags given, so the environment fills in the rest,
then the defaults here. A variable is `SANDFLEET_<SETTING>` unless its field names another (the
agent key and the RuntimeClasses keep their `SANDFLEET_OPERATOR_` names, the leader's namespace
falls back to the Pod's own `POD_NAMESPACE`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sandfleet import __version__
from sandfleet.core.api import DEFAULT_CLUSTER, DEFAULT_RUNTIME_CLASS
from sandfleet.core.ledger import DEFAULT_SHARDS, MAX_SHARDS

_JSON_LIST = '["a", "b"]'  # a JSON list, as a message shows it

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
PullPolicy = Literal["Always", "IfNotPresent", "Never"]
# What `sandbox_image/build agent-bundle-image` names its image (and the chart's default).
DEFAULT_AGENT_BUNDLE_IMAGE = f"localhost/sandfleet/agent-bundle:{__version__}"


class OperatorSettings(BaseSettings):
    """How an operator runs: what it watches, where it elects its leader, what it serves and labels.

    Only what a person sets lives here. What a running operator derives from it is handed over
    beside it, never folded in: its identity among the replicas (host, process, a random tail) and
    the fleet key's bytes, read from `agent_key_file` (`controller/main.py`).
    """

    model_config = SettingsConfigDict(
        env_prefix="SANDFLEET_",
        extra="ignore",
        env_ignore_empty=True,  # an empty variable is unset, as it was when read by hand
        populate_by_name=True,  # flags pass fields by name; the aliases below are variables only
        frozen=True,
    )

    namespaces: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Namespaces to watch (comma-separated or a JSON list); every namespace when empty."
    )
    leader_namespace: str | None = Field(
        None,
        validation_alias=AliasChoices("SANDFLEET_LEADER_NAMESPACE", "POD_NAMESPACE"),
        description="Namespace of the leader Lease (the chart sets POD_NAMESPACE, the operator's own); "
        "without one, the first watched namespace, else `default`.",
    )
    leader_lease_seconds: float = Field(
        15.0,
        gt=0,
        le=300,
        description="How long a silent leader keeps the Lease before another replica takes over "
        "(seconds, above 0, at most 300).",
    )
    metrics_port: int = Field(8080, ge=0, le=65535, description="Prometheus /metrics port; 0 turns it off.")
    liveness: str | None = Field(
        None, description="kopf's liveness endpoint, e.g. http://0.0.0.0:8081/healthz; none when unset."
    )
    agent_key_file: Path | None = Field(
        None,
        validation_alias=AliasChoices("SANDFLEET_OPERATOR_AGENT_KEY_FILE"),
        description="A file with the fleet key (hex) each sandbox agent's token derives from; the "
        "gateway holds the same (the chart mounts its Secret there). Required.",
    )
    runtime_classes: Annotated[frozenset[str], NoDecode] = Field(
        frozenset({DEFAULT_RUNTIME_CLASS}),
        validation_alias=AliasChoices("SANDFLEET_OPERATOR_RUNTIME_CLASSES"),
        description="RuntimeClasses pools may name (comma-separated, at least one); a pool naming "
        "another gets no sandboxes.",
    )
    cluster: str = Field(
        DEFAULT_CLUSTER,
        description="The name of this cluster, the `cluster` label of every metric (in a fleet, the "
        "name the fleet gateway's --member gives it).",
    )
    log_level: LogLevel = Field("INFO", description="DEBUG, INFO, WARNING, ERROR or CRITICAL.")
    ledger_shards: int = Field(
        DEFAULT_SHARDS,
        ge=1,
        le=MAX_SHARDS,
        description=f"Ledger shards that new Pods of `ledger` pools spread over, per namespace "
        f"(a whole number from 1 to {MAX_SHARDS}).",
    )

    agent_bundle_image: str = Field(
        DEFAULT_AGENT_BUNDLE_IMAGE,
        min_length=1,
        description="The agent bundle image injected into the sandboxes of pools with "
        "`spec.template.agent: injected` (an init container copies the agent from it).",
    )
    agent_bundle_pull_policy: PullPolicy = Field(
        "IfNotPresent",
        description="The agent bundle image's imagePullPolicy: Always, IfNotPresent or Never.",
    )

    @field_validator("namespaces", "runtime_classes", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        """Names from a comma- (or space-) separated string, a JSON list, or repeated flags."""
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                try:
                    return json.loads(value)
                except json.JSONDecodeError:
                    raise ValueError(
                        f"not a JSON list: write names comma-separated, or {_JSON_LIST!r}"
                    ) from None
            value = [value]
        if isinstance(value, list | tuple | set | frozenset):
            return [part for item in value for part in str(item).replace(",", " ").split()]
        return value

    @field_validator("runtime_classes")
    @classmethod
    def _some_runtime_class(cls, value: frozenset[str]) -> frozenset[str]:
        if not value:
            raise ValueError(f"name at least one RuntimeClass pools may use, e.g. {DEFAULT_RUNTIME_CLASS}")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_case_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @property
    def leader_lease_namespace(self) -> str:
        """Where the leader Lease lives: `leader_namespace`, else the first watched one, else default."""
        return self.leader_namespace or (self.namespaces[0] if self.namespaces else "default")
