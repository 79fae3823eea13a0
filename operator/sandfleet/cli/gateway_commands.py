"""`sandfleet gateway`: serve leases from the Kubernetes runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from sandfleet.cli.app import app

# Each GatewaySettings field's flag (gateway/settings.py): the settings hold the defaults and the
# variables, these options only what is typed on the command line. CapacitySettings and
# TenantSettings have no flags: their SANDFLEET_GATEWAY_* variables only.
FLAGS = {
    "host": "--host",
    "port": "--port",
    "namespace": "--namespace",
    "auth": "--auth",
    "token_file": "--token-file",
    "token_audiences": "--token-audience",
    "max_waiting": "--max-waiting",
    "agent_key_file": "--agent-key-file",
    "insecure_no_agent_key": "--insecure-no-agent-key",
    "share_warm": "--share-warm",
    "replica": "--replica",
    "cluster": "--cluster",
    "members": "--member",
    "member_weights": "--member-weight",
}


@app.command()
def gateway(
    host: Annotated[str | None, typer.Option(help="Address to listen on.", show_default="0.0.0.0")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on.", show_default="8080")] = None,
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", "-n", help="Namespace whose pools to serve.", show_default="default"),
    ] = None,
    auth: Annotated[
        str | None,
        typer.Option(
            help="kubernetes (TokenReview + RBAC), static (token file) or none.", show_default="kubernetes"
        ),
    ] = None,
    token_file: Annotated[
        Path | None, typer.Option(help="Static tokens, lines `TOKEN NAME [POOLS]`.")
    ] = None,
    token_audience: Annotated[
        list[str] | None,
        typer.Option(
            help="Audience a caller's token must carry (repeatable).", show_default="the apiserver's"
        ),
    ] = None,
    max_waiting: Annotated[
        int | None, typer.Option(help="Callers that may queue per pool.", show_default="1000")
    ] = None,
    agent_key_file: Annotated[
        Path | None, typer.Option(help="The fleet key sandboxes' agent tokens derive from (required).")
    ] = None,
    insecure_no_agent_key: Annotated[
        bool | None,
        typer.Option("--insecure-no-agent-key", help="Run without an agent key (agents that accept anyone)."),
    ] = None,
    share_warm: Annotated[
        bool | None,
        typer.Option(
            "--share-warm/--no-share-warm",
            help="Hand out this replica's own share of the warm Pods first.",
            show_default="share",
        ),
    ] = None,
    replica: Annotated[
        str | None,
        typer.Option(
            help="This replica's name among the others (its membership Lease).",
            show_default="$POD_NAME, else host name and process id",
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            help="The name of the cluster this gateway runs in, for its metrics' `cluster` label (in a "
            "fleet, the name the fleet gateway's --member gives it).",
            show_default="default",
        ),
    ] = None,
    member: Annotated[
        list[str] | None,
        typer.Option(
            help="Serve one fleet over several clusters: NAME=KUBECONFIG per member cluster (repeatable; "
            "NAME a DNS label that lease ids carry). Without it: the one cluster of the kubeconfig.",
        ),
    ] = None,
    member_weight: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=WEIGHT: a member's weight in the split of each pool's warm target (repeatable; "
            "default 1 each). A member's share is also held to what its nodes can take.",
        ),
    ] = None,
) -> None:
    """Serve the Kubernetes runtime's pools (kubeconfig or in-cluster config).

    Every option can also come from SANDFLEET_GATEWAY_<OPTION> (e.g. SANDFLEET_GATEWAY_NAMESPACE;
    lists as JSON), --replica from POD_NAME (gateway/settings.py); a flag given on the command line
    wins over the environment.
    """
    from sandfleet.cli.settings_flags import load_settings
    from sandfleet.core.agent_tokens import AgentKeyError
    from sandfleet.gateway.main import run
    from sandfleet.gateway.settings import CapacitySettings, GatewaySettings, TenantSettings
    from sandfleet.kube.errors import KubeConfigError

    given: dict[str, Any] = {
        "host": host,
        "port": port,
        "namespace": namespace,
        "auth": auth,
        "token_file": token_file,
        "token_audiences": token_audience or None,
        "max_waiting": max_waiting,
        "agent_key_file": agent_key_file,
        "insecure_no_agent_key": insecure_no_agent_key,
        "share_warm": share_warm,
        "replica": replica,
        "cluster": cluster,
        "members": parse_members(member or []) or None,
        "member_weights": parse_weights(member_weight or []) or None,
    }
    # Only flags actually given are passed, so the environment fills in the rest.
    settings = load_settings(GatewaySettings, given, FLAGS)
    capacity = load_settings(CapacitySettings, {})
    tenancy = load_settings(TenantSettings, {})
    try:
        run(settings, capacity, tenancy)
    except AgentKeyError as error:
        raise typer.BadParameter(str(error)) from None
    except KubeConfigError as error:
        typer.echo(f"sandfleet gateway: {error}", err=True)
        raise typer.Exit(2) from None


def parse_members(values: list[str]) -> dict[str, Path]:
    """`--member NAME=KUBECONFIG` flags as {name: kubeconfig}; BadParameter naming the bad one."""
    members: dict[str, Path] = {}
    for value in values:
        name, equals, kubeconfig = value.partition("=")
        if not equals or not name or not kubeconfig:
            raise typer.BadParameter(f"--member {value!r}: write NAME=KUBECONFIG, e.g. eu1=~/.kube/eu1.yaml")
        if name in members:
            raise typer.BadParameter(f"--member {name!r} is given twice: each member cluster once")
        members[name] = Path(kubeconfig).expanduser()
    return members


def parse_weights(values: list[str]) -> dict[str, float]:
    """`--member-weight NAME=WEIGHT` flags as {name: weight}; BadParameter naming the bad one."""
    weights: dict[str, float] = {}
    for value in values:
        name, equals, number = value.partition("=")
        try:
            weights[name] = float(number)
        except ValueError:
            weights[name] = float("nan")  # refused below, with the rest
        if not equals or not name:
            raise typer.BadParameter(f"--member-weight {value!r}: write NAME=WEIGHT, e.g. eu1=2")
    return weights  # each checked by GatewaySettings (a number above 0, naming a --member)
