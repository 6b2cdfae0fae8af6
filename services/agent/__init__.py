"""The cairn agent: one per machine; it offers the machine's slots and runs trials on them.

- :mod:`services.agent.slots`: GPU discovery (``nvidia-smi``) or CPU slots.
- :mod:`services.agent.client`: the HTTP client for the API gateway (retries, idempotency keys).
- :mod:`services.agent.runtime`: the process runtime (code, environment, processes, log shipping).
- :mod:`services.agent.signals`: preempt and kill (SIGTERM, then SIGKILL to the process group).
- :mod:`services.agent.agent`: registration, heartbeats and the command loop.

The contract with the rest of cairn is ``docs/protocol.md``.
"""
