"""cairn: what users import and run (CLI, Core API, local cluster launcher)."""

__version__ = "0.1.0"
