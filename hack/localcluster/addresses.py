"""The cluster's address plan: the Service range, kwok's fake pod range and the real node's addresses."""

from __future__ import annotations

SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the first address of SERVICE_CIDR: the `kubernetes` Service
KWOK_POD_CIDR = "10.244.0.0/16"  # handed to kwok for fake pod IPs; nothing is ever routed there
# The real node: private addresses only on interfaces the cluster creates (see realnode.py).
NODE_IP = "10.213.0.1"
REAL_POD_CIDR = "10.214.0.0/24"
REAL_POD_GATEWAY = "10.214.0.1"

# The real-node cluster the e2e suites and bench/real_node_pods.py share (one real node fits on a
# host). Never the shared test cluster's ports (/tmp/sandfleet-cluster, 16443, ...) nor the
# other benchmarks' clusters'.
REAL_NODE_TEST_ENV = {
    "SANDFLEET_CLUSTER_DIR": "/tmp/sandfleet-real-node-test",
    "SANDFLEET_APISERVER_PORT": "36443",
    "SANDFLEET_ETCD_PORT": "43790",
    "SANDFLEET_ETCD_PEER_PORT": "43800",
    "SANDFLEET_CONTROLLER_MANAGER_PORT": "30257",
    "SANDFLEET_SCHEDULER_PORT": "30259",
    "SANDFLEET_KWOK_PORT": "30247",
    "SANDFLEET_KUBELET_PORT": "30250",
    "SANDFLEET_KUBELET_HEALTHZ_PORT": "30248",
    "SANDFLEET_KUBE_PROXY_METRICS_PORT": "30249",
    "SANDFLEET_KUBE_PROXY_HEALTHZ_PORT": "30256",
}
