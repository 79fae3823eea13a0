"""The gateway: leases sandboxes to rollout workers and proxies their data plane."""
