"""Names of the sandfleet API: the CRD group, kinds, labels and annotations every component shares.

A sandbox on Kubernetes is one Pod. Its lease lives in one of two stores, chosen per pool
(`spec.lease.store`) and fixed per Pod when it is created:

- `ledger` (the default): the Pod is labelled `lease-state=ledger` and a shard; its lease is an
  entry in that shard's SandboxLedger, changed in batches by conditional writes (core.ledger), so
  a burst of N leases costs about N / batch writes;
- `pod`: the Pod is labelled `lease-state=free`; the gateway claims it by patching it to `leased`
  with a resourceVersion precondition (a lost race is a 409, never a double lease), and release
  patches it to `released`.

Either way the operator deletes released Pods and Pods whose lease expired, and never deletes a
leased Pod to shrink a pool.
"""

from typing import Final

GROUP: Final = "sandfleet.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

POOL_KIND: Final = "SandboxPool"
POOL_PLURAL: Final = "sandboxpools"
PREWARM_KIND: Final = "SandboxPrewarm"
PREWARM_PLURAL: Final = "sandboxprewarms"
# The lease ledger (core.ledger): the leases of one shard of a namespace's sandbox Pods.
LEDGER_KIND: Final = "SandboxLedger"
LEDGER_PLURAL: Final = "sandboxledgers"
LEDGER_NAME_PREFIX: Final = "sandfleet-ledger-"

REGION_LABEL: Final = "topology.kubernetes.io/region"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"

DEFAULT_RUNTIME_CLASS: Final = "gvisor"
DEFAULT_AGENT_PORT: Final = 8000
# Where a pool's agent comes from (spec.template.agent): the image's own entrypoint (an image
# sandbox_image/build made), or the agent bundle the operator injects (any image).
AGENT_IMAGE: Final = "image"
AGENT_INJECTED: Final = "injected"

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
# On a Pod whose lease lives in its namespace's ledger (a pool with spec.lease.store "ledger"): which
# shard's SandboxLedger holds it. Set once, at creation: a Pod never moves between stores.
SHARD_LABEL: Final = f"{GROUP}/shard"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
# On the coordination.k8s.io Lease each gateway replica renews, so replicas find each other.
GATEWAY_MEMBER_LABEL: Final = f"{GROUP}/gateway-member"
MANAGED_BY: Final = "sandfleet"

LEASE_FREE: Final = "free"
LEASE_LEASED: Final = "leased"
LEASE_RELEASED: Final = "released"
# Reset after its run's episode and waiting for that run's next lease (a pool with spec.recycle).
LEASE_RESERVED: Final = "reserved"
# The operator is deleting it (a ledger entry, written before the delete): nobody may lease it.
LEASE_RETIRED: Final = "retired"
# The lease-state label of a Pod whose lease lives in the ledger: read without the ledger it is
# neither free (so never leased) nor leased (so never reaped).
LEASE_IN_LEDGER: Final = "ledger"

# Where a pool's leases are written (spec.lease.store).
STORE_LEDGER: Final = "ledger"
STORE_POD: Final = "pod"

# Annotations on sandbox Pods.
LEASE_ANNOTATION: Final = f"{GROUP}/lease"  # JSON, see sandfleet.core.leases.LeaseRecord (holds the expiry)
# Unix seconds: written by versions before the expiry moved into LEASE_ANNOTATION alone; now cleared on
# every lease write, and read only on a Pod that has no lease record.
LEASE_EXPIRES_ANNOTATION: Final = f"{GROUP}/lease-expires-at"
# On a recycled Pod: how many episodes it has served (its agent's episode number; absent means 0).
EPISODES_ANNOTATION: Final = f"{GROUP}/episodes"
# On a reserved Pod: JSON {holder, run, since}, whose next lease of that run it waits for since when.
RESERVED_ANNOTATION: Final = f"{GROUP}/reserved"

# On a SandboxPool in a fleet's member cluster, written by the fleet gateway: the fraction (0 to 1) of
# spec.replicas this member keeps warm (its share of the fleet's serving members; absent means all).
FLEET_SHARE_ANNOTATION: Final = f"{GROUP}/fleet-share"
# The `cluster` label of an operator or gateway given no name for its cluster (the chart's clusterName).
DEFAULT_CLUSTER: Final = "default"

SANDBOX_CONTAINER: Final = "sandbox"
