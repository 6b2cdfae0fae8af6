"""The environment a cluster's child process starts with.

A child inherits ours (plus the checkout on ``PYTHONPATH``); a service also gets its bus settings
from :func:`service_nats_env`. No secret is put in an environment: a service's credentials are in
files of its own (:mod:`cairn.local.service_credentials`), and the environment names those files.
"""

from __future__ import annotations

import os
from pathlib import Path

from cairn.local.layout import join_token_file
from cairn.local.servers import bare_nats_url, nats_authority_file, nats_url_as
from cairn.local.topology import service_of
from events.log.bus_auth import USER_ROLES

_REPO_ROOT = Path(__file__).resolve().parents[2]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: ours, plus the repo root on ``PYTHONPATH`` in a checkout."""
    env = dict(os.environ)
    if (_REPO_ROOT / "services" / "runtime.py").is_file():
        parts = [str(_REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env.update(extra or {})
    return env


def service_nats_env(name: str, nats_url: str, data_dir: Path) -> dict[str, str]:
    """The bus settings of process ``name``: each service its own NATS user (a path in the
    URL); an agent the bare URL and the join token file (it joins for its own user); the API
    also the authority file, to issue agents' users."""
    service = service_of(name)
    if service == "agent":
        return {
            "CAIRN_NATS": bare_nats_url(nats_url),
            "CAIRN_JOIN_TOKEN_FILE": str(join_token_file(data_dir)),
        }
    env = {"CAIRN_NATS": nats_url_as(nats_url, service if service in USER_ROLES else "admin")}
    if service == "api":
        env["CAIRN_JOIN_TOKEN_FILE"] = str(join_token_file(data_dir))
        authority = nats_authority_file(nats_url)
        if authority is not None:
            env["CAIRN_NATS_AUTHORITY_FILE"] = str(authority)
    return env
