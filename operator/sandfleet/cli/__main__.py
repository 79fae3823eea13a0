"""`python -m sandfleet.cli` runs the command line."""

from sandfleet.cli import app

app()
