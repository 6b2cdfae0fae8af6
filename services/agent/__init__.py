"""The cairn agent: one per machine; it offers the machine's slots and runs trials on them.

- :mod:`services.agent.slots`: GPU discovery (``nvidia-smi``) or CPU slots.
- :mod:`services.agent.client`: the HTTP client for the API gateway (retries, idempotency keys).
- :mod:`services.agent.runtime`: the process runtime (spec, code, work directory, environment).
- :mod:`services.agent.processes`: a run's processes, one per local rank.
- :mod:`services.agent.log_shipping`: a run's output lines, shipped in batches.
- :mod:`services.agent.signals`: preempt and kill (SIGTERM, then SIGKILL to the process group).
- :mod:`services.agent.agent`: registration, heartbeats and the command loop.
- :mod:`services.agent.commands`: the commands of the agent's queue (start, preempt, kill).
- :mod:`services.agent.runs`: one run, from its spec to its exit (rendezvous, gang watch).
- :mod:`services.agent.exits`: exit reports, kept on disk until the API takes them.
- :mod:`services.agent.state` and :mod:`services.agent.config`: what the parts share.

The contract with the rest of cairn is ``docs/protocol.md``.
"""
