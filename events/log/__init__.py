"""The log's machinery: where facts are stored and how they travel. Where to find what:

| module | what |
|---|---|
| ``store`` | the event store: serialized appends with expected versions, reads upcast on the way out |
| ``db`` | PostgreSQL pools and the one place driver errors are translated |
| ``envelope``, ``registry`` | the stored envelope; (type, version) -> upcasters -> current model |
| ``storable``, ``limits`` | what PostgreSQL can hold; event and bus size limits |
| ``migrations`` | ordered schema migrations per owner, each applied once |
| ``consumer``, ``inbox`` | checkpointed idempotent consumers; idempotent intake of requests |
| ``lease`` | leader leases (advisory lock + epoch in the log) and fencing |
| ``bus``, ``bus_auth``, ``relay`` | NATS JetStream transport, who may speak on it, the relay |
| ``catalogue`` | the event catalogue (docs/events.md) rendered from the registry |
| ``errors``, ``faults``, ``origin``, ``redact``, ``logging`` | errors, fault points, who appended, URL redaction, structlog set-up |
"""
