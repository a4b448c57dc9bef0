"""The package version (the bottom layer: imports nothing)."""

__version__ = "0.1.0"
