"""Every environment variable cairn reads, declared once: name, type, default, reader, meaning.

This is the only module that reads a ``CAIRN_*`` variable (or a Determined twin such as
``DET_MASTER``) from an environment; everything else asks a :class:`Setting` here. It lives in
``events/`` because that is the one package every cairn process imports — services, agents, the
CLI and trial processes (``cairn.core`` builds on ``events.domain``) — and at its top, beside
``log`` and ``domain``, because it belongs to neither. It imports only the standard library.

Invariants a change must keep:

- **Read at call time.** Nothing here or in a caller reads a variable at import time;
  :meth:`Setting.get` reads the environment it is given (``os.environ`` by default) when called,
  so a test or a launcher that sets a variable later is honoured.
- **Empty is unset.** A variable set to an empty (or blank) value counts as unset, except where
  a setting says ``keep_empty`` (a password may be empty).
- **Malformed is an error.** A value its type refuses raises :class:`SettingError`, naming the
  variable and the value; no setting falls back to its default silently.
- **Secrets are only named.** A ``*_FILE`` setting holds the path of a file with a secret;
  :mod:`services.credentials` reads that file. A setting marked ``secret`` holds a secret by
  value and is never handed to a child process.
- **``CAIRN_HOME`` is resolved in one function**, :func:`cairn_home`.

``python -m events.settings --markdown`` prints the table of ``docs/configuration.md``;
``python -m events.settings --write docs/configuration.md`` rewrites it there.

Example::

    from events import settings

    port = settings.API_PORT.get()           # 8080 unless CAIRN_API_PORT says otherwise
    root = settings.CHECKPOINT_ROOT.get({})  # None: read from the mapping given, not os.environ
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")

Environ = Mapping[str, str]


class SettingError(ValueError):
    """A variable is set to a value its setting cannot parse (the message names both)."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable.

    Attributes:
        name: the variable (``CAIRN_API_PORT``).
        type_name: its type as the documentation table shows it.
        parse: turns a set, non-empty value into the typed one; raises ``ValueError`` (or
            ``TypeError``) saying what is wrong.
        default: what :meth:`get` returns when the variable is unset.
        read_by: which processes read it (``every service``, ``api``, ``agent``, ``trial``...).
        description: one line of what it means.
        default_doc: the default as the table shows it, when ``default`` is not the whole story
            (a default computed by the reader, such as the host name).
        secret: the value is a secret (never passed on to a child process).
        secret_file: the value names a file holding a secret (read by
            :mod:`services.credentials` or its reader, never logged).
        keep_empty: an empty value is a value, not "unset".
    """

    name: str
    type_name: str
    parse: Callable[[str], T]
    default: T
    read_by: str
    description: str
    default_doc: str | None = None
    secret: bool = False
    secret_file: bool = False
    keep_empty: bool = False

    def raw(self, environ: Environ | None = None) -> str | None:
        """The variable's text as set, or ``None`` when unset (or empty, unless ``keep_empty``).

        Args:
            environ: the environment to read (``os.environ`` by default).
        """
        env = os.environ if environ is None else environ
        value = env.get(self.name)
        if value is None or (not self.keep_empty and not value.strip()):
            return None
        return value

    def is_set(self, environ: Environ | None = None) -> bool:
        """Whether the variable is set to something (see :meth:`raw`)."""
        return self.raw(environ) is not None

    def get(self, environ: Environ | None = None) -> T:
        """The typed value, or :attr:`default` when the variable is unset.

        Args:
            environ: the environment to read (``os.environ`` by default).

        Raises:
            SettingError: the value is malformed; the message names the variable and the value.
        """
        raw = self.raw(environ)
        if raw is None:
            return copy.copy(self.default)  # a default list or dict is the caller's to change
        try:
            return self.parse(raw)
        except (ValueError, TypeError) as exc:
            raise SettingError(
                f"{self.name}={raw!r}: {exc} (expected {self.type_name}: {self.description})"
            ) from None


# --- parsers: each raises ValueError saying what is wrong -----------------------------------


def _text(raw: str) -> str:
    return raw


def _path(raw: str) -> Path:
    return Path(raw)


def _integer(raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError("not an integer") from None


def _port(raw: str) -> int:
    value = _integer(raw)
    if not 0 <= value <= 65535:
        raise ValueError("not a port number (0-65535)")
    return value


def _address(raw: str) -> tuple[str, int]:
    host, sep, port = raw.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError("not HOST:PORT (e.g. 127.0.0.1:9464 or 0.0.0.0:9464)")
    return host, int(port)


def _count(raw: str) -> int:
    value = _integer(raw)
    if value < 0:
        raise ValueError("not a count (0 or more)")
    return value


def _replicas(raw: str) -> int:
    value = _integer(raw)
    if not 1 <= value <= 5:
        raise ValueError("not a replica count (1-5)")
    return value


def _seconds(raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError("not a number of seconds") from None
    if not value > 0:
        raise ValueError("not a positive number of seconds")
    return value


def _json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None


def _json_object(raw: str) -> dict[str, Any]:
    value = _json(raw)
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object (a {type(value).__name__})")
    return value


def _json_strings(raw: str) -> list[str]:
    value = _json(raw)
    if not isinstance(value, list):
        raise ValueError(f"not a JSON list (a {type(value).__name__})")
    return [str(item) for item in value]


def _json_integers(raw: str) -> list[int]:
    value = _json(raw)
    if not isinstance(value, list):
        raise ValueError(f"not a JSON list (a {type(value).__name__})")
    return [int(item) for item in value]


def _fault_points(raw: str) -> dict[str, float]:
    points: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, seconds = item.partition("=")
        try:
            points[name.strip()] = float(seconds or "0")
        except ValueError:
            raise ValueError(f"{item!r} is not NAME=SECONDS") from None
    return points


_LOG_LEVELS = ("NOTSET", "DEBUG", "INFO", "WARN", "WARNING", "ERROR", "FATAL", "CRITICAL")


def _log_level(raw: str) -> str:
    level = raw.strip().upper()
    if level not in _LOG_LEVELS:
        raise ValueError(f"not a log level ({', '.join(_LOG_LEVELS)})")
    return level


# --- reader names used in the table ---------------------------------------------------------

SERVICES = "every service"
"""The control-plane services (api, searcher, scheduler, tracker, relay) and ``services.migrate``."""
AGENT = "agent"
API = "api"
TRIAL = "trial"
"""A trial process (``cairn.core``, the launchers), from the environment its agent gives it."""
CLI = "CLI/SDK"
"""The ``cairn`` command, ``cairn.experimental`` and the client side of ``cairn.core``."""

# --- the services ---------------------------------------------------------------------------

DB: Setting[str | None] = Setting(
    "CAIRN_DB", "str", _text, None, f"{SERVICES}",
    "PostgreSQL DSN by value (`--db`); visible to other processes, prefer CAIRN_DB_FILE",
    secret=True,
)  # fmt: skip
DB_FILE: Setting[Path | None] = Setting(
    "CAIRN_DB_FILE", "path", _path, None, f"{SERVICES}",
    "file (mode 0600) holding the PostgreSQL DSN (`--db-file`)",
    secret_file=True,
)  # fmt: skip
NATS: Setting[str | None] = Setting(
    "CAIRN_NATS", "str", _text, None, f"{SERVICES}, {AGENT}",
    "NATS URL by value (`--nats`; a cluster's servers comma-separated); visible to other "
    "processes, prefer CAIRN_NATS_FILE",
    secret=True,
)  # fmt: skip
NATS_FILE: Setting[Path | None] = Setting(
    "CAIRN_NATS_FILE", "path", _path, None, f"{SERVICES}, {AGENT}",
    "file (mode 0600) holding the NATS URL (`--nats-file`)",
    secret_file=True,
)  # fmt: skip
NATS_REPLICAS: Setting[int | None] = Setting(
    "CAIRN_NATS_REPLICAS", "1-5", _replicas, None, f"{SERVICES}, {AGENT}",
    "copies of each JetStream stream (3 on a cluster of three NATS servers); the servers "
    "of the NATS URL are comma-separated",
    default_doc="the servers the NATS URL names, at most 3",
)  # fmt: skip
LOG_LEVEL: Setting[str] = Setting(
    "CAIRN_LOG_LEVEL", "log level", _log_level, "INFO", f"{SERVICES}, {AGENT}",
    "structlog level (`--log-level`)",
)  # fmt: skip
CLUSTER_CONFIG: Setting[Path | None] = Setting(
    "CAIRN_CLUSTER_CONFIG", "path", _path, None, f"{SERVICES}, {AGENT}",
    "the administrator's cluster config (`--cluster-config`; docs/cluster-config.md)",
    default_doc="none: every default",
)  # fmt: skip
READY_FILE: Setting[Path | None] = Setting(
    "CAIRN_READY_FILE", "path", _path, None, f"{SERVICES}, {AGENT}",
    "file the process writes its pid to once it is ready (set by `cairn up`)",
)  # fmt: skip
FAULTS: Setting[dict[str, float]] = Setting(
    "CAIRN_FAULTS", "NAME=SECONDS,...", _fault_points, {}, f"{SERVICES}, {AGENT}",
    "fault-injection points that pause (fault tests only; events/log/faults.py)",
    default_doc="none",
)  # fmt: skip
LEASE_TIMEOUT: Setting[float] = Setting(
    "CAIRN_LEASE_TIMEOUT", "seconds > 0", _seconds, 1.5, f"{SERVICES} (deciders)",
    "after this long a paused leader's session ends and a standby takes over",
)  # fmt: skip
METRICS_ADDRESS: Setting[tuple[str, int] | None] = Setting(
    "CAIRN_METRICS_ADDRESS", "HOST:PORT", _address, None, f"{SERVICES} but api, {AGENT}",
    "where the process serves /metrics, /healthz and /readyz (`--metrics-address`; "
    "docs/operations.md); for the internal network only",
    default_doc="none: no listener",
)  # fmt: skip
METRICS_TOKEN_FILE: Setting[Path | None] = Setting(
    "CAIRN_METRICS_TOKEN_FILE", "path", _path, None, API,
    "file (mode 0600) with the bearer token a scraper presents for the gateway's /metrics "
    "(`--metrics-token-file`); admins' tokens are accepted too",
    default_doc="none: admins' tokens only",
    secret_file=True,
)  # fmt: skip
READY_MAX_LAG: Setting[int] = Setting(
    "CAIRN_READY_MAX_LAG", "events", _count, 10_000, f"{SERVICES} but api",
    "a leading consumer further behind the log's head than this is not ready (/readyz)",
)  # fmt: skip
API_PORT: Setting[int] = Setting(
    "CAIRN_API_PORT", "port", _port, 8080, API,
    "the gateway's HTTP port (`--port`)",
)  # fmt: skip
ADMIN_PASSWORD: Setting[str | None] = Setting(
    "CAIRN_ADMIN_PASSWORD", "str", _text, None, f"{API}, cairn up, {CLI}",
    "the admin's password by value: taken by `cairn up` at the first start instead of a "
    "generated one; the gateway's when no CAIRN_ADMIN_PASSWORD_FILE",
    secret=True,
)  # fmt: skip
ADMIN_PASSWORD_FILE: Setting[Path | None] = Setting(
    "CAIRN_ADMIN_PASSWORD_FILE", "path", _path, None, API,
    "file (mode 0600) holding the admin's password",
    secret_file=True,
)  # fmt: skip
AGENT_TOKEN: Setting[str | None] = Setting(
    "CAIRN_AGENT_TOKEN", "str", _text, None, f"{API}, {AGENT}",
    "the join token by value (`--agent-token`), for clusters configured that way",
    secret=True,
)  # fmt: skip
JOIN_TOKEN_FILE: Setting[Path | None] = Setting(
    "CAIRN_JOIN_TOKEN_FILE", "path", _path, None, f"{API}, {AGENT}",
    "file (mode 0600) with the cluster's join token (`--join-token-file`)",
    secret_file=True,
)  # fmt: skip
NATS_AUTHORITY_FILE: Setting[Path | None] = Setting(
    "CAIRN_NATS_AUTHORITY_FILE", "path", _path, None, API,
    "the bus's signing authority, to issue agents NATS users (`--nats-authority-file`)",
    secret_file=True,
)  # fmt: skip
CHECKPOINT_ROOT: Setting[Path | None] = Setting(
    "CAIRN_CHECKPOINT_ROOT", "path", _path, None, f"tracker, {AGENT}, {API}",
    "checkpoint storage of experiments without `checkpoint_storage` (`--checkpoint-root`)",
    default_doc="$CAIRN_HOME/checkpoints, else ~/.cairn/checkpoints (agent: <work-dir>/checkpoints)",
)  # fmt: skip
CUSTOM_SEARCHER_TIMEOUT: Setting[float] = Setting(
    "CAIRN_CUSTOM_SEARCHER_TIMEOUT", "seconds > 0", _seconds, 10.0, "searcher",
    "seconds one call into a custom searcher's sandbox may take",
)  # fmt: skip
HOME: Setting[Path | None] = Setting(
    "CAIRN_HOME", "path", _path, None, f"{CLI}, cairn up, {AGENT}, tracker, {API}",
    "the embedded cluster's data directory; also where auth.json, agents' work directories "
    "and checkpoints go by default",
    default_doc="data directory: ./.cairn (or the cluster started last); else ~/.cairn",
)  # fmt: skip

# --- the agent ------------------------------------------------------------------------------

API_URL: Setting[str | None] = Setting(
    "CAIRN_API_URL", "URL", _text, None, AGENT,
    "the API gateway the agent reports to (`--api-url`)",
)  # fmt: skip
AGENT_ID: Setting[str | None] = Setting(
    "CAIRN_AGENT_ID", "str", _text, None, f"{AGENT}, {TRIAL}",
    "the agent's id (`--agent-id`); in a trial, the agent that started it",
    default_doc="agent: the host name; trial: empty",
)  # fmt: skip
AGENT_WORK_DIR: Setting[Path | None] = Setting(
    "CAIRN_AGENT_WORK_DIR", "path", _path, None, AGENT,
    "run directories and code cache (`--work-dir`)",
    default_doc="$CAIRN_HOME/agents/<id>, else ~/.cairn/agents/<id>",
)  # fmt: skip
RENDEZVOUS_TIMEOUT: Setting[float] = Setting(
    "CAIRN_RENDEZVOUS_TIMEOUT", "seconds > 0", _seconds, 300.0, AGENT,
    "how long a run on several agents waits for all of them (`--rendezvous-timeout`)",
)  # fmt: skip
AGENT_ADDRESS: Setting[str | None] = Setting(
    "CAIRN_AGENT_ADDRESS", "str", _text, None, AGENT,
    "the address the other agents of a gang reach this one by (`--address`)",
    default_doc="the address on the route to the API",
)  # fmt: skip
DOCKER_SHARE_FROM: Setting[str | None] = Setting(
    "CAIRN_DOCKER_SHARE_FROM", "str", _text, None, AGENT,
    "the container the agent runs in (`self`: this host name); trial containers share its "
    "volumes and network (`--docker-share-from`)",
)  # fmt: skip

# --- the CLI and SDK ------------------------------------------------------------------------

MASTER: Setting[str | None] = Setting(
    "CAIRN_MASTER", "URL", _text, None, f"{CLI}, {TRIAL}",
    "the master's address (`-m`); in a trial, the gateway it reports to",
    default_doc="DET_MASTER, DET_MASTER_ADDR, the embedded cluster, http://localhost:8080",
)  # fmt: skip
DET_MASTER: Setting[str | None] = Setting(
    "DET_MASTER", "URL", _text, None, CLI,
    "Determined's name for CAIRN_MASTER (CAIRN_MASTER wins)",
)  # fmt: skip
DET_MASTER_ADDR: Setting[str | None] = Setting(
    "DET_MASTER_ADDR", "URL", _text, None, CLI,
    "Determined's older name for CAIRN_MASTER (read after DET_MASTER)",
)  # fmt: skip
USER: Setting[str | None] = Setting(
    "CAIRN_USER", "str", _text, None, f"{CLI}, {TRIAL}",
    "the user to log in as (with CAIRN_PASSWORD); in a trial, the experiment's owner",
)  # fmt: skip
PASSWORD: Setting[str | None] = Setting(
    "CAIRN_PASSWORD", "str", _text, None, CLI,
    "the password of CAIRN_USER (or of the user given with `-u`)",
    secret=True, keep_empty=True,
)  # fmt: skip
DET_USER: Setting[str | None] = Setting(
    "DET_USER", "str", _text, None, CLI,
    "Determined's name for CAIRN_USER (the CAIRN_ pair wins)",
)  # fmt: skip
DET_PASS: Setting[str | None] = Setting(
    "DET_PASS", "str", _text, None, CLI,
    "Determined's name for CAIRN_PASSWORD (the CAIRN_ pair wins)",
    secret=True, keep_empty=True,
)  # fmt: skip

# --- a trial's environment, set by its agent (docs/protocol.md) -----------------------------

TOKEN: Setting[str] = Setting(
    "CAIRN_TOKEN", "str", _text, "", TRIAL,
    "the bearer token scoped to this run",
    secret=True,
)  # fmt: skip
EXPERIMENT_ID: Setting[int] = Setting(
    "CAIRN_EXPERIMENT_ID", "int", _integer, 0, TRIAL, "the trial's experiment",
)  # fmt: skip
TRIAL_ID: Setting[int] = Setting(
    "CAIRN_TRIAL_ID", "int", _integer, 0, TRIAL, "the trial (a cluster-wide integer)",
)  # fmt: skip
RUN_ID: Setting[int] = Setting(
    "CAIRN_RUN_ID", "int", _integer, 1, TRIAL, "which run of the trial this is (1, 2, ...)",
)  # fmt: skip
ALLOCATION_ID: Setting[str | None] = Setting(
    "CAIRN_ALLOCATION_ID", "str", _text, None, f"{TRIAL}, {AGENT}",
    "`<trial_id>.<run_id>`; the agent finds its leftover processes by it",
)  # fmt: skip
SLOT_IDS: Setting[list[str]] = Setting(
    "CAIRN_SLOT_IDS", "JSON list of str", _json_strings, [], TRIAL,
    "the run's slots on this agent (a GPU slot's id is its UUID)",
)  # fmt: skip
HPARAMS: Setting[dict[str, Any]] = Setting(
    "CAIRN_HPARAMS", "JSON object", _json_object, {}, TRIAL, "the trial's hyperparameters",
)  # fmt: skip
TRIAL_SEED: Setting[int] = Setting(
    "CAIRN_TRIAL_SEED", "int", _integer, 0, TRIAL, "the trial's random seed",
)  # fmt: skip
LATEST_CHECKPOINT: Setting[str | None] = Setting(
    "CAIRN_LATEST_CHECKPOINT", "str", _text, None, TRIAL, "the checkpoint uuid to resume from",
)  # fmt: skip
PREEMPT_SIGNALS: Setting[str | None] = Setting(
    "CAIRN_PREEMPT_SIGNALS", "str", _text, None, TRIAL,
    "signals (TERM,USR2) that mean checkpoint and exit: set by an agent a resource manager runs",
)  # fmt: skip
STEPS_COMPLETED: Setting[int] = Setting(
    "CAIRN_STEPS_COMPLETED", "int", _integer, 0, TRIAL,
    "steps of the checkpoint this run resumes from",
)  # fmt: skip
CHECKPOINT_DIR: Setting[str | None] = Setting(
    "CAIRN_CHECKPOINT_DIR", "path", _text, None, TRIAL,
    "the root of the trial's checkpoints (shared_fs/directory storage)",
    default_doc="off-cluster: a local directory, with a warning",
)  # fmt: skip
EXPERIMENT_CONFIG: Setting[dict[str, Any]] = Setting(
    "CAIRN_EXPERIMENT_CONFIG", "JSON object", _json_object, {}, TRIAL,
    "the experiment config as JSON",
)  # fmt: skip
CLUSTER_ID: Setting[str] = Setting(
    "CAIRN_CLUSTER_ID", "str", _text, "", TRIAL, "the cluster's id",
)  # fmt: skip
TASK_ID: Setting[str | None] = Setting(
    "CAIRN_TASK_ID", "str", _text, None, TRIAL, "the task this process belongs to",
    default_doc="the trial id",
)  # fmt: skip
SERVE_TOKEN: Setting[str | None] = Setting(
    "CAIRN_SERVE_TOKEN", "str", _text, None, "a shell's or TensorBoard's server",
    "the token every request to the task's server must carry (the API's proxy adds it)",
    secret=True,
)  # fmt: skip
TASK_TYPE: Setting[str] = Setting(
    "CAIRN_TASK_TYPE", "str", _text, "TRIAL", TRIAL,
    "what the process runs for: `TRIAL`, or a task's kind (`COMMAND`, `NOTEBOOK`)",
)  # fmt: skip
CONTAINER_ADDRS: Setting[list[str] | None] = Setting(
    "CAIRN_CONTAINER_ADDRS", "JSON list of str", _json_strings, None, TRIAL,
    "the address of each machine of the run, by container rank",
    default_doc="from MASTER_ADDR and the rank variables",
)  # fmt: skip
CONTAINER_RANK: Setting[int | None] = Setting(
    "CAIRN_CONTAINER_RANK", "int", _integer, None, TRIAL,
    "this machine's index among the run's machines",
    default_doc="RANK // LOCAL_WORLD_SIZE",
)  # fmt: skip
CONTAINER_SLOT_COUNTS: Setting[list[int] | None] = Setting(
    "CAIRN_CONTAINER_SLOT_COUNTS", "JSON list of int", _json_integers, None, TRIAL,
    "the number of slots of each machine of the run, by container rank",
    default_doc="from the rank variables",
)  # fmt: skip
NODE_RANK: Setting[int] = Setting(
    "CAIRN_NODE_RANK", "int", _integer, 0, TRIAL, "this agent's index in a gang (launchers)",
)  # fmt: skip
NUM_NODES: Setting[int | None] = Setting(
    "CAIRN_NUM_NODES", "int", _integer, None, TRIAL, "the number of agents of a gang",
    default_doc="launchers: 1; the Core API: WORLD_SIZE // LOCAL_WORLD_SIZE",
)  # fmt: skip
RANK_OFFSET: Setting[int] = Setting(
    "CAIRN_RANK_OFFSET", "int", _integer, 0, TRIAL, "the global rank of this agent's first rank",
)  # fmt: skip


MASTERS = (MASTER, DET_MASTER, DET_MASTER_ADDR)
"""Where a client reads the master's address from, first set wins."""
CREDENTIALS = ((USER, PASSWORD), (DET_USER, DET_PASS))
"""(user, password) pairs a client logs in with, first pair set wins."""


def _collect() -> tuple[Setting[Any], ...]:
    found = tuple(v for v in globals().values() if isinstance(v, Setting))
    names = [s.name for s in found]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise RuntimeError(f"settings declared twice: {', '.join(duplicated)}")
    return found


SETTINGS: tuple[Setting[Any], ...] = _collect()
"""Every setting, in declaration order."""


def by_name(name: str) -> Setting[Any]:
    """The setting of the variable ``name``.

    Raises:
        KeyError: no setting reads ``name`` (declare it here first).
    """
    for setting in SETTINGS:
        if setting.name == name:
            return setting
    raise KeyError(f"{name} is not a cairn setting; declare it in events/settings.py")


# --- CAIRN_HOME -----------------------------------------------------------------------------

USER_DIR = Path("~/.cairn")
"""The per-user directory used when ``CAIRN_HOME`` is unset: tokens (``auth.json``), an agent's
work directories and the default checkpoint root (docs/tracking.md). The embedded cluster's data
directory defaults to ``./.cairn`` instead (README), see :func:`cairn.local.layout.default_data_dir`."""


def cairn_home(environ: Environ | None = None) -> Path | None:
    """The directory ``$CAIRN_HOME`` names, with ``~`` expanded, absolute and resolved.

    This is the one place ``CAIRN_HOME`` is interpreted. Its two defaults when unset belong to
    two different things and stay with them: the embedded cluster's data directory (``./.cairn``,
    or the cluster started last; :func:`cairn.local.layout.default_data_dir`) and the per-user
    directory (:func:`home_or_user_dir`).

    Args:
        environ: the environment to read (``os.environ`` by default).

    Returns:
        The directory, or ``None`` when ``CAIRN_HOME`` is unset or empty.
    """
    home = HOME.get(environ)
    return home.expanduser().resolve() if home is not None else None


def home_or_user_dir(environ: Environ | None = None) -> Path:
    """``$CAIRN_HOME`` (see :func:`cairn_home`), else ``~/.cairn``; absolute.

    Where tokens (``auth.json``), an agent's work directories (``agents/<id>``) and the default
    checkpoint root (``checkpoints``) live.
    """
    return cairn_home(environ) or USER_DIR.expanduser().absolute()


# --- the documentation table ----------------------------------------------------------------

BEGIN_MARKER = "<!-- BEGIN GENERATED SETTINGS TABLE: python -m events.settings --write docs/configuration.md -->"
END_MARKER = "<!-- END GENERATED SETTINGS TABLE -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default_cell(setting: Setting[Any]) -> str:
    if setting.default_doc is not None:
        return setting.default_doc
    default = setting.default
    if default is None:
        return "none"
    if isinstance(default, str):
        return f"`{default}`" if default else "empty"
    if isinstance(default, dict | list):
        return f"`{json.dumps(default)}`"
    return f"`{default}`"


def markdown_table() -> str:
    """The table of every setting, as ``docs/configuration.md`` holds it (no trailing newline)."""
    lines = [
        "| variable | type | default | read by | secret | what |",
        "|---|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        secret = "value" if s.secret else "file" if s.secret_file else ""
        cells = (
            f"`{s.name}`",
            s.type_name,
            _default_cell(s),
            s.read_by,
            secret,
            s.description,
        )
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def with_table(document: str) -> str:
    """``document`` with the text between its markers replaced by :func:`markdown_table`.

    Raises:
        ValueError: the document lacks a marker.
    """
    start = document.find(BEGIN_MARKER)
    end = document.find(END_MARKER)
    if start < 0 or end < start:
        raise ValueError(f"the document needs the lines {BEGIN_MARKER!r} and {END_MARKER!r}")
    head = document[: start + len(BEGIN_MARKER)]
    return f"{head}\n{markdown_table()}\n{document[end:]}"


def main(argv: list[str] | None = None) -> int:
    """``--markdown``: prints the table; ``--write PATH``: rewrites it between PATH's markers."""
    parser = argparse.ArgumentParser(prog="python -m events.settings", description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print the settings table")
    group.add_argument("--write", type=Path, metavar="PATH", help="rewrite PATH's table")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_table())
        return 0
    path: Path = args.write
    try:
        path.write_text(with_table(path.read_text()))
    except (OSError, ValueError) as exc:
        print(f"cannot rewrite {path}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
