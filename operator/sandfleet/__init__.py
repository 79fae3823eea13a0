"""sandfleet: a Kubernetes-native fleet of gVisor-isolated coding sandboxes for agentic RL."""

__version__ = "0.1.0"
