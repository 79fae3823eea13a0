"""The pure layer: decisions from plain data and a time passed in; no I/O, no clients."""
