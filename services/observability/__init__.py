"""What operators watch: Prometheus metrics, liveness and readiness of every cairn process.

Metrics are read-only views. A process's own measurements (append latency and batch size, HTTP
latency at the gateway, an agent's heartbeats) are kept in its registry
(:mod:`services.observability.process`); the cluster's state (queues, slots, allocations,
consumer lag, agents' heartbeat ages, webhook backlog) is read from the database at each scrape
(:mod:`services.api.cluster_gauges`), never folded or decided anew. Label values are resource
pools, consumer names, states, agent ids and route templates: never a user, a path with ids or
anything a user typed. ``docs/operations.md`` lists every metric and what to alert on.
"""
