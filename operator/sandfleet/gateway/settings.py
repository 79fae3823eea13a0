"""Gateway settings, from flags or SANDFLEET_* environment variables (pydantic-settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# Idle keep-alive connections live longer on the server than in clients (httpx drops its own after
# 5 s): with equal timeouts a client reuses a connection at the instant the server closes it, and
# the request fails with a protocol error instead of being served.
KEEP_ALIVE_SECONDS = 65


class GatewaySettings(BaseSettings):
    """How a gateway serves: where, which namespace, how callers authenticate."""

    model_config = SettingsConfigDict(env_prefix="SANDFLEET_GATEWAY_", extra="ignore")

    host: str = "0.0.0.0"
    port: int = Field(8080, ge=1, le=65535)
    namespace: str = Field("default", description="Namespace whose pools this gateway serves.")
    auth: Literal["kubernetes", "static", "none"] = "kubernetes"
    token_file: Path | None = Field(None, description="Static tokens: lines `TOKEN NAME [POOLS]`.")
    agent_token_file: Path | None = None
    max_waiting: int = Field(1000, ge=0, description="Callers that may wait per pool before 429.")
    token_audiences: list[str] = Field(
        default_factory=list,
        description="Audiences a caller's token must carry (TokenReview); empty means the apiserver's.",
    )
