"""Programs cairn runs as tasks on the cluster (a TensorBoard's server), started by the agent
with ``python -m cairn.tasks.<program>``."""
