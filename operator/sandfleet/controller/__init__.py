"""The operator: kopf handlers that keep SandboxPools filled with warm sandboxes."""
