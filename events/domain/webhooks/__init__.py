"""Webhooks' pure rules: which URLs and addresses a webhook may reach (:mod:`.urls`), which
webhooks a happening fires (:mod:`.matching`), and the bodies they are sent (:mod:`.payloads`).

No I/O here: resolving a host name and posting are :mod:`services.webhooks`' business.
"""
