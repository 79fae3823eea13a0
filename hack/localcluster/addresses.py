"""The cluster's address plan: the Service range, kwok's fake pod range and the real node's addresses."""

from __future__ import annotations

SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the first address of SERVICE_CIDR: the `kubernetes` Service
KWOK_POD_CIDR = "10.244.0.0/16"  # handed to kwok for fake pod IPs; nothing is ever routed there
# The real node: private addresses only on interfaces the cluster creates (see realnode.py).
NODE_IP = "10.213.0.1"
REAL_POD_CIDR = "10.214.0.0/24"
REAL_POD_GATEWAY = "10.214.0.1"
