"""The backbone every service imports: the log's machinery and cairn's domain, no service logic.

- :mod:`events.log`: how facts are kept and travel — the PostgreSQL store (append with optimistic
  concurrency, ordered reads, upcasting at the read boundary), the NATS bus and its relay,
  consumers with checkpoints, leader leases, migrations, size limits, errors.
- :mod:`events.domain`: what the facts say — event types, the folds of each aggregate, the
  lifecycle state machines, the log's invariants, ids and stream names, agent commands, the
  experiment and cluster config schemas, checkpoint storage.
- :mod:`events.settings`: every environment variable a cairn process reads, declared once and
  read at call time (``docs/configuration.md`` is generated from it).

``log`` never imports ``domain`` except where it decodes events through the registry the types
fill; ``domain`` builds on ``log``'s envelope and errors.
"""
