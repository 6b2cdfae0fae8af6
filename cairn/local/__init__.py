"""The embedded cluster: real PostgreSQL and NATS servers plus every service, on one machine."""
