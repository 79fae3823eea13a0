"""One client configuration: the kubeconfig (KUBECONFIG or ~/.kube/config), else the in-cluster identity."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, Configuration

from sandfleet.kube.errors import KubeConfigError

__all__ = ["ApiClient", "Configuration", "api_client", "kubeconfig_paths", "load_configuration"]

DEFAULT_KUBECONFIG = "~/.kube/config"
# What aiohttp's trust_env reads: with none of these set, trusting the environment finds nothing.
ENVIRONMENT_PROXY_VARIABLES = ("http_proxy", "https_proxy", "ws_proxy", "wss_proxy", "all_proxy", "netrc")


def kubeconfig_paths(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The kubeconfig files that exist, in KUBECONFIG's order (a path list), else the default one."""
    listed = environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    paths = [os.path.expanduser(p) for p in listed.split(os.pathsep) if p]
    return [p for p in paths if os.path.isfile(p)]


async def load_configuration() -> Configuration:
    """The API client configuration; KubeConfigError (one line) when there is none to be had."""
    configuration = Configuration()
    paths = kubeconfig_paths()
    if paths:
        return await load_configuration_from(os.pathsep.join(paths))
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException as error:
        raise KubeConfigError(
            "no Kubernetes credentials: no kubeconfig (set KUBECONFIG or write ~/.kube/config) and no "
            f"in-cluster identity ({error})"
        ) from None
    return configuration


async def load_configuration_from(kubeconfig: str | Path) -> Configuration:
    """The API client configuration of a kubeconfig (a path list too); KubeConfigError if unusable."""
    configuration = Configuration()
    try:
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError) as error:
        raise KubeConfigError(f"cannot use the kubeconfig {kubeconfig}: {error}") from None
    return configuration


def api_client(configuration: Configuration, pool_size: int) -> ApiClient:
    """An ApiClient over `configuration` with `pool_size` connections (callers issue many at once)."""
    configuration.connection_pool_maxsize = pool_size
    made = ApiClient(configuration)
    if not uses_environment_proxies(os.environ):
        # kubernetes_asyncio's session trusts the environment, so every request looks up the proxy
        # variables and ~/.netrc in a worker thread: two thread hops per apiserver call, for nothing.
        # A kubeconfig's proxy-url still applies (it is passed per request, not read from the environment).
        made.rest_client.pool_manager._trust_env = False
    return made


def uses_environment_proxies(environ: Mapping[str, str]) -> bool:
    """Whether the environment names a proxy or a netrc file (aiohttp's trust_env would use them)."""
    return any(name.lower() in ENVIRONMENT_PROXY_VARIABLES for name, value in environ.items() if value)
