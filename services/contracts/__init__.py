"""Wire contracts between cairn's processes, each written once and imported by both sides.

| module | what |
|---|---|
| ``agent`` | every request and answer between an agent and the API gateway (``/api/v1/agents``, ``/api/v1/allocations``) |

A module here imports only pydantic and :mod:`events.domain`; no service's code, so any two
services may share it without importing each other.
"""
