"""Names of the sandfleet API: the CRD group, kinds, labels and annotations every component shares."""

from typing import Final

GROUP: Final = "sandfleet.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

POOL_KIND: Final = "SandboxPool"
POOL_PLURAL: Final = "sandboxpools"

REGION_LABEL: Final = "topology.kubernetes.io/region"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"

DEFAULT_RUNTIME_CLASS: Final = "gvisor"
DEFAULT_AGENT_PORT: Final = 8000
