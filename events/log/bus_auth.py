"""Who may speak on the bus: NATS decentralized auth (operator, account and user JWTs).

nats-server runs in operator mode: it trusts one operator key, and through the operator's
signed account JWT (preloaded in its config) every user JWT that the account's *signing key*
signed. A user JWT carries the user's subject permissions, so issuing a credential needs no
change to the server and no restart: whoever holds the signing seed (the API, for agents; ``cairn
up``, for the services) mints a ``.creds`` file and the server checks it at connect time.
Anonymous clients are refused (operator mode has no unauthenticated user).

Roles and what each may do on the bus (:func:`permissions`):

- ``relay``: publishes events (``cairn.evt.>``) and agent commands (``cairn.cmd.>``), manages
  the streams; the only role that may publish either.
- ``service`` (scheduler, searcher, tracker, api): reads the event stream through its own
  durable consumers; publishes on no ``cairn.>`` subject.
- ``agent``: binds only its own durable consumer ``agent-<id>`` of the command stream,
  filtered on its own subject ``cairn.cmd.agent.<id>``, acks its own messages, and receives
  replies only on its own inbox prefix; it can neither read other agents' commands nor publish
  an event or a command.
- ``admin``: everything (``cairn up``'s own checks and the tests).

Invariant: a seed (``S...``) is secret and is only ever written to mode 0600 files; JWTs and
public keys are not secret.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import nkeys

from events.log.bus import COMMANDS_PREFIX, COMMANDS_STREAM, EVENTS_PREFIX, EVENTS_STREAM
from events.log.errors import EventsError

Role = Literal["relay", "service", "agent", "admin"]
ROLES: tuple[Role, ...] = ("relay", "service", "agent", "admin")

_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_UNLIMITED = -1
ACCOUNT_NAME = "CAIRN"
AUTHORITY_FILE = "authority.json"
"""The name of the file (mode 0600) that holds an :class:`Authority`."""
USER_ROLES: dict[str, Role] = {
    "admin": "admin",
    "relay": "relay",
    "scheduler": "service",
    "searcher": "service",
    "tracker": "service",
    "api": "service",
}
"""The bus users of a cluster's own processes and the role of each (agents join instead)."""
SYSTEM_ACCOUNT_NAME = "SYS"
_CREDS = (
    "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
    "************************* IMPORTANT *************************\n"
    "NKEY Seed printed below can be used to sign and prove identity.\n"
    "NKEYs are sensitive and should be treated as secrets.\n\n"
    "-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n"
    "*************************************************************\n"
)


class BusAuthError(EventsError):
    """A bus credential or key file is missing, unreadable or malformed."""


_PREFIXES = {
    "operator": nkeys.PREFIX_BYTE_OPERATOR,
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "user": nkeys.PREFIX_BYTE_USER,
}


def new_seed(kind: Literal["operator", "account", "user"]) -> str:
    """A fresh nkey seed (``SO...``, ``SA...`` or ``SU...``) for a key of ``kind``."""
    return bytes(nkeys.encode_seed(secrets.token_bytes(32), _PREFIXES[kind])).decode()


def public_key(seed: str) -> str:
    """The public key (``O...``, ``A...``, ``U...``) of ``seed``.

    Raises:
        BusAuthError: ``seed`` is not an nkey seed.
    """
    try:
        return bytes(nkeys.from_seed(bytearray(seed.encode())).public_key).decode()
    except Exception as exc:  # nkeys raises its own zoo on bad input
        raise BusAuthError(f"not an nkey seed: {exc}") from exc


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def encode_jwt(claims: Mapping[str, Any], signer_seed: str) -> str:
    """Signs ``claims`` (``jti``, ``iat`` and ``iss`` are filled in) into a NATS JWT (v2)."""
    body = dict(claims)
    body.setdefault("iat", int(time.time()))
    body["iss"] = public_key(signer_seed)
    body["jti"] = ""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    signing_input = f"{_b64(json.dumps(_HEADER).encode())}.{_b64(json.dumps(body).encode())}"
    signature = nkeys.from_seed(bytearray(signer_seed.encode())).sign(signing_input.encode())
    return f"{signing_input}.{_b64(bytes(signature))}"


def decode_jwt(token: str) -> dict[str, Any]:
    """The claims of a NATS JWT, unverified (for listing what a credential grants)."""
    try:
        claims = token.split(".")[1]
        decoded = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    except (IndexError, ValueError) as exc:
        raise BusAuthError(f"not a JWT: {exc}") from exc
    if not isinstance(decoded, dict):
        raise BusAuthError("not a JWT: its claims are not an object")
    return decoded


# --- permissions ------------------------------------------------------------------------------


def safe_token(agent_id: str) -> str:
    """``agent_id`` as one NATS subject token (what :func:`events.domain.commands.agent_subject` uses)."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in agent_id)


def agent_durable(agent_id: str) -> str:
    """The name of the agent's durable consumer on the command stream."""
    return f"agent-{safe_token(agent_id)}"


def agent_inbox(agent_id: str) -> str:
    """The inbox prefix of an agent's connection: replies reach it only there."""
    return f"_INBOX_agent.{safe_token(agent_id)}"


def permissions(role: Role, *, agent_id: str | None = None) -> dict[str, Any]:
    """The ``pub``/``sub`` permissions of a user of ``role`` (see the module docstring).

    Raises:
        BusAuthError: ``role`` is ``agent`` without ``agent_id``, or unknown.
    """
    js_read = [
        "$JS.API.INFO",
        f"$JS.API.STREAM.INFO.{EVENTS_STREAM}",
        f"$JS.API.STREAM.INFO.{COMMANDS_STREAM}",
        "$JS.API.STREAM.NAMES",
        f"$JS.API.CONSUMER.*.{EVENTS_STREAM}.>",
        f"$JS.API.CONSUMER.*.*.{EVENTS_STREAM}.>",
        f"$JS.ACK.{EVENTS_STREAM}.>",
    ]
    manage = [
        f"$JS.API.STREAM.CREATE.{EVENTS_STREAM}",
        f"$JS.API.STREAM.CREATE.{COMMANDS_STREAM}",
        f"$JS.API.STREAM.UPDATE.{EVENTS_STREAM}",
        f"$JS.API.STREAM.UPDATE.{COMMANDS_STREAM}",
    ]
    if role == "admin":
        return {"pub": {"allow": [">"]}, "sub": {"allow": [">"]}}
    if role == "relay":
        tail = f"$JS.API.STREAM.MSG.GET.{EVENTS_STREAM}"  # what the bus still holds (relay.py)
        return {
            "pub": {
                "allow": [f"{EVENTS_PREFIX}.>", f"{COMMANDS_PREFIX}.>", *js_read, *manage, tail]
            },
            "sub": {"allow": ["_INBOX.>"]},
        }
    if role == "service":
        return {"pub": {"allow": [*js_read, *manage]}, "sub": {"allow": ["_INBOX.>"]}}
    if role == "agent":
        if not agent_id:
            raise BusAuthError("an agent's permissions need its agent id")
        token = safe_token(agent_id)
        durable = agent_durable(agent_id)
        subject = f"{COMMANDS_PREFIX}.agent.{token}"
        return {
            "pub": {
                "allow": [
                    "$JS.API.INFO",
                    f"$JS.API.STREAM.INFO.{COMMANDS_STREAM}",
                    f"$JS.API.CONSUMER.CREATE.{COMMANDS_STREAM}.{durable}.{subject}",
                    f"$JS.API.CONSUMER.INFO.{COMMANDS_STREAM}.{durable}",
                    f"$JS.API.CONSUMER.MSG.NEXT.{COMMANDS_STREAM}.{durable}",
                    f"$JS.ACK.{COMMANDS_STREAM}.{durable}.>",
                ]
            },
            "sub": {"allow": [f"{agent_inbox(agent_id)}.>"]},
        }
    raise BusAuthError(f"unknown bus role {role!r}; one of {', '.join(ROLES)}")


# --- the authority: operator, account, signing key --------------------------------------------


@dataclass(frozen=True)
class Authority:
    """The keys of a cluster's bus: an operator, the cairn account, a system account, and the
    account's signing key, which signs every user (services and agents).

    Attributes:
        operator_jwt: the operator's self-signed JWT (the server's trust root).
        account_jwt: the cairn account's JWT (JetStream enabled), signed by the operator.
        system_jwt: the system account's JWT, signed by the operator.
        signing_seed: the seed that signs user JWTs of the cairn account (secret).
    """

    operator_jwt: str
    account_jwt: str
    system_jwt: str
    signing_seed: str

    @property
    def account(self) -> str:
        """The cairn account's public key."""
        return str(decode_jwt(self.account_jwt)["sub"])

    @property
    def system_account(self) -> str:
        """The system account's public key."""
        return str(decode_jwt(self.system_jwt)["sub"])

    def server_config(self) -> str:
        """The operator-mode lines of a nats-server config: trust, accounts and resolver."""
        return (
            f'operator: "{self.operator_jwt}"\n'
            f"system_account: {self.system_account}\n"
            "resolver: MEMORY\n"
            "resolver_preload: {\n"
            f'  {self.account}: "{self.account_jwt}"\n'
            f'  {self.system_account}: "{self.system_jwt}"\n'
            "}\n"
        )

    def user_creds(self, name: str, role: Role, *, agent_id: str | None = None) -> str:
        """A ``.creds`` text (user JWT plus its seed) for a new user of ``role``.

        Args:
            name: shown by the server in its logs and connection lists.
            role: what the user may do (see :func:`permissions`).
            agent_id: the agent, for role ``agent``.
        """
        seed = new_seed("user")
        claims = {
            "sub": public_key(seed),
            "name": name,
            "nats": {
                **permissions(role, agent_id=agent_id),
                "issuer_account": self.account,
                "subs": _UNLIMITED,
                "data": _UNLIMITED,
                "payload": _UNLIMITED,
                "type": "user",
                "version": 2,
            },
        }
        return _CREDS.format(jwt=encode_jwt(claims, self.signing_seed), seed=seed)

    def to_json(self) -> str:
        """The authority as stored (mode 0600: it holds the signing seed)."""
        return json.dumps(
            {
                "operator_jwt": self.operator_jwt,
                "account_jwt": self.account_jwt,
                "system_jwt": self.system_jwt,
                "signing_seed": self.signing_seed,
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Authority:
        """Reads :meth:`to_json`'s form.

        Raises:
            BusAuthError: the text is not such an object.
        """
        try:
            data = json.loads(text)
            authority = cls(
                operator_jwt=str(data["operator_jwt"]),
                account_jwt=str(data["account_jwt"]),
                system_jwt=str(data["system_jwt"]),
                signing_seed=str(data["signing_seed"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise BusAuthError(f"not a bus authority file: {exc}") from exc
        public_key(authority.signing_seed)
        return authority

    @classmethod
    def create(cls) -> Authority:
        """New keys: the operator seed signs the two accounts and is then forgotten, so no
        file holds a key that could make new accounts."""
        operator = new_seed("operator")
        account = new_seed("account")
        system = new_seed("account")
        signing = new_seed("account")
        operator_jwt = encode_jwt(
            {
                "sub": public_key(operator),
                "name": "cairn",
                "nats": {
                    "system_account": public_key(system),
                    "type": "operator",
                    "version": 2,
                },
            },
            operator,
        )
        limits = {
            "subs": _UNLIMITED,
            "data": _UNLIMITED,
            "payload": _UNLIMITED,
            "imports": _UNLIMITED,
            "exports": _UNLIMITED,
            "wildcards": True,
            "conn": _UNLIMITED,
            "leaf": _UNLIMITED,
        }
        jetstream = {
            "mem_storage": _UNLIMITED,
            "disk_storage": _UNLIMITED,
            "streams": _UNLIMITED,
            "consumer": _UNLIMITED,
        }
        account_jwt = encode_jwt(
            {
                "sub": public_key(account),
                "name": ACCOUNT_NAME,
                "nats": {
                    "limits": {**limits, **jetstream},
                    "signing_keys": [public_key(signing)],
                    "default_permissions": {"pub": {"deny": [">"]}, "sub": {"deny": [">"]}},
                    "type": "account",
                    "version": 2,
                },
            },
            operator,
        )
        system_jwt = encode_jwt(
            {
                "sub": public_key(system),
                "name": SYSTEM_ACCOUNT_NAME,
                "nats": {"limits": limits, "type": "account", "version": 2},
            },
            operator,
        )
        return cls(operator_jwt, account_jwt, system_jwt, signing)


def write_private(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` with mode 0600 from the first byte (replacing it atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_private(path: Path, *, what: str) -> str:
    """Reads a secret file, refusing one that others may read.

    Raises:
        BusAuthError: it is missing, unreadable, or readable by group or others.
    """
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as exc:
        raise BusAuthError(f"cannot read the {what} at {path}: {exc}") from exc
    if mode & 0o077:
        raise BusAuthError(
            f"the {what} at {path} is readable by others (mode {mode & 0o777:o}); "
            f"make it 0600 (chmod 600 {path})"
        )
    return text


def grants_current(creds_text: str, role: Role) -> bool:
    """Whether a service's ``.creds`` text allows exactly what ``role`` allows now: a user issued
    by an older cairn whose role has since gained (or lost) a subject is issued anew."""
    now = permissions(role)
    return subjects_of(creds_text) == {
        "pub": list(now["pub"].get("allow", [])),
        "sub": list(now["sub"].get("allow", [])),
    }


def subjects_of(creds_text: str) -> dict[str, Sequence[str]]:
    """What a ``.creds`` text allows: ``{"pub": [...], "sub": [...]}`` (for listings and tests)."""
    jwt = creds_text.split("-----BEGIN NATS USER JWT-----\n", 1)[-1].split("\n", 1)[0]
    nats_claims = decode_jwt(jwt).get("nats", {})
    return {
        "pub": list(nats_claims.get("pub", {}).get("allow", [])),
        "sub": list(nats_claims.get("sub", {}).get("allow", [])),
    }
