"""Checkpoint uuids that the gateway issues to trials, and the check that a report names one.

A checkpoint is the directory (or prefix) ``<root>/<uuid>``, and the GC and downloads act on
the uuids trials report, so a trial must not be able to name a checkpoint after something that
is already there (another directory, another trial's checkpoint in progress). The Core API
therefore asks for each new checkpoint's uuid (``POST /api/v1/trials/{trial_id}/checkpoint-ids``)
and the gateway accepts a checkpoint report only under a uuid it issued to that trial.

No table records the issued uuids: a uuid carries its own proof. Its first 8 bytes are random
(with the version nibble set to 8, RFC 9562's custom version) and its last 8 are an HMAC-SHA256
of the trial id and those random bytes under a key derived from the cluster secret (with the
RFC's variant bits set), so 62 bits of the tag are checked. The text form is the canonical
lowercase ``8-4-4-4-12`` one, which is all a report may carry.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid as uuidlib

_KEY_LABEL = b"cairn checkpoint uuid v1"
_VERSION = 8
_VARIANT = 0b10


def _key(secret: bytes) -> bytes:
    return hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()


def _tag(secret: bytes, trial_id: int, head: bytes) -> bytes:
    mac = hmac.new(_key(secret), f"{trial_id}:".encode() + head, hashlib.sha256).digest()
    tail = bytearray(mac[:8])
    tail[0] = (tail[0] & 0x3F) | (_VARIANT << 6)
    return bytes(tail)


def issue(secret: bytes, trial_id: int) -> str:
    """A new checkpoint uuid for trial ``trial_id``.

    Args:
        secret: the cluster secret.
        trial_id: the trial that will save the checkpoint.

    Returns:
        The uuid, canonical text (``0f1e...-...``).
    """
    head = bytearray(secrets.token_bytes(8))
    head[6] = (head[6] & 0x0F) | (_VERSION << 4)
    return str(uuidlib.UUID(bytes=bytes(head) + _tag(secret, trial_id, bytes(head))))


def issued_to(secret: bytes, trial_id: int, text: str) -> bool:
    """Whether ``text`` is a checkpoint uuid :func:`issue` gave trial ``trial_id``."""
    if len(text) != 36:
        return False
    try:
        parsed = uuidlib.UUID(text)
    except ValueError:
        return False
    if str(parsed) != text or parsed.version != _VERSION:
        return False
    raw = parsed.bytes
    return hmac.compare_digest(raw[8:], _tag(secret, trial_id, raw[:8]))
