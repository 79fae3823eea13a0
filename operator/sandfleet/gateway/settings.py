"""Gateway settings, from flags or SANDFLEET_* environment variables (pydantic-settings).

The one home of the gateway's configuration, as `controller/settings.py` is the operator's: what
each setting is, its default, its bounds and the variable it is read from (SANDFLEET_GATEWAY_<SETTING>,
unless its field names another). `sandfleet gateway` (`cli/gateway_commands.py`) passes only the
flags given, so the environment fills in the rest, then the defaults here.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sandfleet.core.api import DEFAULT_CLUSTER
from sandfleet.core.quotas import Quotas
from sandfleet.gateway.guard import BodyLimits
from sandfleet.gateway.models import MAX_ACQUIRE
from sandfleet.local.layers import (
    DEFAULT_DISK_RESERVE_BYTES,
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_ENTRIES,
    LayerLimits,
)

# A member cluster's name goes into lease ids and metric labels: a DNS label, as a namespace is.
MEMBER_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?")

# Idle keep-alive connections live longer on the server than in clients (httpx drops its own after
# 5 s): with equal timeouts a client reuses a connection at the instant the server closes it, and
# the request fails with a protocol error instead of being served.
KEEP_ALIVE_SECONDS = 65


class GatewaySettings(BaseSettings):
    """How a gateway serves: where, which namespace, how callers authenticate."""

    model_config = SettingsConfigDict(
        env_prefix="SANDFLEET_GATEWAY_",
        extra="ignore",
        populate_by_name=True,  # flags pass fields by name; an alias below is a variable only
    )

    host: str = "0.0.0.0"
    port: int = Field(8080, ge=1, le=65535)
    namespace: str = Field("default", description="Namespace whose pools this gateway serves.")
    auth: Literal["kubernetes", "static", "none"] = "kubernetes"
    token_file: Path | None = Field(None, description="Static tokens: lines `TOKEN NAME [POOLS]`.")
    agent_key_file: Path | None = Field(
        None, description="The fleet key every sandbox's agent token derives from (the chart's Secret)."
    )
    insecure_no_agent_key: bool = Field(
        False, description="Serve without an agent key: only for agents that accept anyone (tests)."
    )
    max_waiting: int = Field(1000, ge=0, description="Callers that may wait per pool before 429.")
    token_audiences: list[str] = Field(
        default_factory=list,
        description="Audiences a caller's token must carry (TokenReview); empty means the apiserver's.",
    )
    members: dict[str, Path] = Field(
        default_factory=dict,
        description="Serve one fleet over several member clusters: member name -> its kubeconfig "
        "(each runs its own operator). Empty: the one cluster of the kubeconfig or in-cluster identity.",
    )
    member_weights: dict[str, float] = Field(
        default_factory=dict,
        description="A member's weight in the split of every pool's warm target (default 1; its share "
        "is also held to what its nodes can take, the rest moving to the others).",
    )
    cluster: str = Field(
        DEFAULT_CLUSTER,
        description="The name of the cluster this gateway runs in (the chart's clusterName): the "
        "`cluster` label of its metrics where no --member names the sandbox's cluster.",
    )
    share_warm: bool = Field(
        True,
        description="Find the other replicas (coordination Leases) and hand out this replica's own "
        "share of the warm Pods first, so replicas do not race for the same ones.",
    )
    replica: str | None = Field(
        None,
        validation_alias=AliasChoices("POD_NAME"),
        description="This replica's name among the others (its membership Lease): the chart sets "
        "POD_NAME to its Pod's name; without one, the host's name and the process id.",
    )

    @field_validator("members")
    @classmethod
    def _member_names(cls, members: dict[str, Path]) -> dict[str, Path]:
        for name in members:
            if not MEMBER_NAME.fullmatch(name):
                raise ValueError(
                    f"member name {name!r} must be a DNS label of at most 32 characters (lower-case "
                    "letters, digits, '-'; a letter or digit at each end): lease ids carry it"
                )
        return members

    @field_validator("cluster")
    @classmethod
    def _cluster_name(cls, cluster: str) -> str:
        if not MEMBER_NAME.fullmatch(cluster):
            raise ValueError(
                f"cluster name {cluster!r} must be a DNS label of at most 32 characters, as a member's "
                "name is: in a fleet it is the name the fleet gateway gives this cluster with --member"
            )
        return cluster

    @model_validator(mode="after")
    def _weights_name_members(self) -> GatewaySettings:
        for name, weight in self.member_weights.items():
            if name not in self.members:
                raise ValueError(f"member_weights names {name!r}, which no --member names: give it one")
            if not (weight > 0 and math.isfinite(weight)):
                raise ValueError(f"member {name!r}'s weight {weight} must be a finite number above 0")
        return self


class CapacitySettings(BaseSettings):
    """What one tenant may take, and how long a group may be overtaken (both gateways, both runtimes).

    Read from SANDFLEET_GATEWAY_* by `sandfleet gateway` and `sandfleet serve --local` alike.
    """

    model_config = SettingsConfigDict(env_prefix="SANDFLEET_GATEWAY_", extra="ignore")

    max_leases_per_tenant: int = Field(
        2000, ge=1, description="Live leases (plus those being acquired) one caller may hold; 429 above."
    )
    max_group_size: int = Field(256, ge=1, description="Sandboxes one acquire may ask for; 422 above.")
    max_batch_size: int = Field(
        4096,
        ge=1,
        le=MAX_ACQUIRE,
        description="Sandboxes one batch acquire (`min_count` below `count`) may ask for; 422 above.",
    )
    max_prefetch_per_tenant: int = Field(
        1024, ge=1, description="Warm sandboxes one prefetch may ask for, all images together; 422 above."
    )
    overtake_seconds: float = Field(
        5.0,
        ge=0,
        le=3600,
        description="How long a request that cannot be served whole yet may be overtaken by smaller "
        "ones behind it; after that it collects every sandbox that becomes warm (0: strict FIFO).",
    )

    def quotas(self) -> Quotas:
        return Quotas(
            self.max_leases_per_tenant,
            self.max_group_size,
            self.max_prefetch_per_tenant,
            self.max_batch_size,
        )


class TenantSettings(BaseSettings):
    """The tenant boundary: who may act on a run, what one caller (or address) can make us hold.

    Read from SANDFLEET_GATEWAY_* by `sandfleet gateway` and `sandfleet serve --local` alike.
    """

    model_config = SettingsConfigDict(env_prefix="SANDFLEET_GATEWAY_", extra="ignore")

    run_admins: list[str] = Field(
        default_factory=list,
        description="Caller names or groups that may act on every run (others only on their own).",
    )
    metric_runs: int = Field(
        50, ge=0, le=10_000, description="Runs with their own loop-phase series; the rest are `other`."
    )
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Body cap of the JSON control routes.")
    max_agent_body_bytes: int = Field(
        64 << 20, ge=1024, description="Body cap of the data plane's JSON routes (exec, jobs, evaluate)."
    )
    max_upload_bytes: int = Field(
        1 << 30, ge=1024, description="Body cap of file and archive uploads (streamed to the agent)."
    )
    header_timeout_seconds: float = Field(
        10.0, gt=0, le=600, description="Time a connection has to send a request's headers."
    )
    body_idle_seconds: float = Field(
        30.0, gt=0, le=3600, description="Longest pause while a request's body is being sent."
    )
    max_connections_per_client: int = Field(
        512, ge=0, description="Open connections per client address (0: no cap; behind a proxy, raise it)."
    )
    token_cache_size: int = Field(10_000, ge=1, description="TokenReview results kept (LRU).")
    token_cache_seconds: float = Field(30.0, ge=0, description="How long a recognised token is trusted.")
    token_negative_cache_seconds: float = Field(
        5.0, ge=0, description="How long an unrecognised token is remembered as such."
    )

    def body_limits(self) -> BodyLimits:
        return BodyLimits(
            self.max_body_bytes, self.max_agent_body_bytes, self.max_upload_bytes, self.body_idle_seconds
        )


class LocalImageSettings(BaseSettings):
    """What an image may unpack to on this host (`serve --local`): its layers are checked first.

    Read from SANDFLEET_LOCAL_* by `sandfleet serve --local`; docs/images.md, "Bad images".
    """

    model_config = SettingsConfigDict(env_prefix="SANDFLEET_LOCAL_", extra="ignore")

    max_image_bytes: int = Field(
        DEFAULT_MAX_IMAGE_BYTES,
        ge=1 << 20,
        description="Bytes all of an image's layers may decompress to; above it it is refused (a bomb).",
    )
    max_image_entries: int = Field(
        DEFAULT_MAX_IMAGE_ENTRIES, ge=1000, description="Entries all of an image's layers may hold."
    )
    disk_reserve_bytes: int = Field(
        DEFAULT_DISK_RESERVE_BYTES,
        ge=0,
        description="Bytes that must stay free on the rootfs cache's filesystem after an image is unpacked.",
    )

    def limits(self) -> LayerLimits:
        return LayerLimits(self.max_image_bytes, self.max_image_entries, self.disk_reserve_bytes)
