"""Programs cairn runs as tasks on the cluster (a TensorBoard's server, a shell's server), started
by the agent with ``python -m cairn.tasks.<program>``."""

from events import settings

SERVE_TOKEN_VARIABLE = settings.SERVE_TOKEN.name
"""The environment variable holding the token every request to cairn's own task servers must
carry (``Authorization: token <t>``, which the API's proxy adds); never a command line."""
