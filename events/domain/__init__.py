"""cairn's domain: what the facts in the log say and the rules over them. Where to find what:

| module | what |
|---|---|
| ``types`` | the event payload models (frozen, versioned), one module per stream category |
| ``aggregates`` | the one pure fold of each aggregate (experiment, trial with its runs, agent; the cluster of them all), used by every consumer |
| ``lifecycle`` | experiment and trial states and their state machines |
| ``deciders`` | each user or agent action as a pure ``(state, command) -> events or Refusal``, one module per aggregate |
| ``unmanaged`` | the runs of a script outside the cluster: what opening, closing and expiring one appends |
| ``check`` | invariants of a whole log (``python -m events.domain.check DSN``) |
| ``names`` | ids and stream names of experiments, trials and allocations |
| ``commands`` | agent commands derived from logged events |
| ``checkpoints``, ``checkpoint_storage`` | who owns a checkpoint; where checkpoint files live |
| ``identities`` | which unix identity each user's code runs as |
| ``config`` | the experiment config (Determined's schema) and the cluster config |
| ``archive`` | the one safe way to unpack a tar archive |
| ``search`` | the search methods (pure deciders of which trials to run) and ``preview-search``'s simulation, shared by the searcher service and the CLI |
"""
