"""The local runtime: gVisor sandboxes made with runsc on one host, the embedded default with no cluster."""
