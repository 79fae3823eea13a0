"""Names of the sandfleet API: the CRD group, kinds, labels and annotations every component shares.

A sandbox on Kubernetes is one Pod. Its lease lives on the Pod itself (a label for selection, an
annotation with the details), so a claim is one conditional write and survives any restart:

- the operator creates Pods labelled `lease-state=free`;
- the gateway claims a Ready free Pod by patching it to `leased` with a resourceVersion
  precondition (a lost race is a 409, never a double lease);
- release patches it to `released`; the operator deletes released Pods and Pods whose lease
  expired, and never deletes a leased Pod to shrink a pool.
"""

from typing import Final

GROUP: Final = "sandfleet.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

POOL_KIND: Final = "SandboxPool"
POOL_PLURAL: Final = "sandboxpools"
PREWARM_KIND: Final = "SandboxPrewarm"
PREWARM_PLURAL: Final = "sandboxprewarms"

REGION_LABEL: Final = "topology.kubernetes.io/region"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"

DEFAULT_RUNTIME_CLASS: Final = "gvisor"
DEFAULT_AGENT_PORT: Final = 8000

# Labels on sandbox Pods (all low-cardinality except run, which bulk release selects on).
POOL_LABEL: Final = f"{GROUP}/pool"
SANDBOX_REGION_LABEL: Final = f"{GROUP}/region"
TEMPLATE_HASH_LABEL: Final = f"{GROUP}/template-hash"
IMAGE_KEY_LABEL: Final = f"{GROUP}/image-key"
LEASE_STATE_LABEL: Final = f"{GROUP}/lease-state"
RUN_LABEL: Final = f"{GROUP}/run"
# On a Pod leased under an idempotency key: a hash of (holder, key), so a retry reads that key's
# leases from the apiserver itself (a quorum LIST by label) instead of a watch cache that may lag.
LEASE_KEY_LABEL: Final = f"{GROUP}/lease-key"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
# On the coordination.k8s.io Lease each gateway replica renews, so replicas find each other.
GATEWAY_MEMBER_LABEL: Final = f"{GROUP}/gateway-member"
MANAGED_BY: Final = "sandfleet"

LEASE_FREE: Final = "free"
LEASE_LEASED: Final = "leased"
LEASE_RELEASED: Final = "released"
# Reset after its run's episode and waiting for that run's next lease (a pool with spec.recycle).
LEASE_RESERVED: Final = "reserved"

# Annotations on sandbox Pods.
LEASE_ANNOTATION: Final = f"{GROUP}/lease"  # JSON, see sandfleet.core.leases.LeaseRecord (holds the expiry)
# Unix seconds: written by versions before the expiry moved into LEASE_ANNOTATION alone; now cleared on
# every lease write, and read only on a Pod that has no lease record.
LEASE_EXPIRES_ANNOTATION: Final = f"{GROUP}/lease-expires-at"
# On a recycled Pod: how many episodes it has served (its agent's episode number; absent means 0).
EPISODES_ANNOTATION: Final = f"{GROUP}/episodes"
# On a reserved Pod: JSON {holder, run, since}, whose next lease of that run it waits for since when.
RESERVED_ANNOTATION: Final = f"{GROUP}/reserved"

SANDBOX_CONTAINER: Final = "sandbox"
