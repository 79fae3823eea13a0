"""Thin adapters so RL frameworks use sandfleet as their sandbox backend (each over the client only)."""
