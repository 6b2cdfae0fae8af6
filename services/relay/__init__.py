"""The relay service: moves committed events from PostgreSQL onto NATS JetStream (leader-only)."""
