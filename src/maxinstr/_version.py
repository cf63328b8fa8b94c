"""The package's version, below every layer (the root re-exports it)."""

__version__ = "0.1.0"
