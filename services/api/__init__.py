"""The API gateway: REST + OpenAPI for users, agents and trial processes (``docs/protocol.md``)."""
