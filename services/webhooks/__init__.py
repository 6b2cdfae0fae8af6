"""Sending webhook deliveries, shared by the tracker (which delivers what the log fires) and the
API gateway (which sends a test delivery on request); no service of its own.

| module | what |
|---|---|
| ``signing`` | the per-webhook signing keys and the signature headers |
| ``addresses`` | the resolver that refuses internal addresses at connect time, and the cluster's own endpoints |
| ``sending`` | one attempt: post a body, say how it went |
"""
