"""Local Kubernetes cluster from source: etcd, control plane and kwok nodes, for tests and demos."""
