"""A NATS client run inside the lab cluster (``python - MODE ...`` in a container of the services
image, reading this file on standard input); prints one JSON line.

- ``connect URL``: connects without a credential; reports whether the server let it in.
- ``count URL CREDS``: the number of messages in the event and command streams.
- ``forge URL CREDS CREDENTIAL_JSON AGENT ALLOCATION``: as the user of ``CREDS`` (with the inbox
  prefix of the agent credential ``CREDENTIAL_JSON``, or ``-``), publishes a forged ``kill`` and
  ``start`` for ``ALLOCATION`` on ``AGENT``'s command subject and a forged event, each through
  JetStream and plainly; reports which the server acknowledged and the permission violations
  it sent back.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import nats

from events.domain.commands import agent_subject
from events.log.bus import COMMANDS_STREAM, EVENTS_STREAM, connect_options


async def connect(url: str, creds: str | None, errors: list[str], inbox: str | None = None) -> Any:
    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    options: dict[str, Any] = {**connect_options(url)}
    if creds:
        options["user_credentials"] = creds
    if inbox:
        options["inbox_prefix"] = inbox
    return await nats.connect(
        **options,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        connect_timeout=10,
        error_cb=on_error,
    )


async def anonymous(url: str) -> dict[str, Any]:
    errors: list[str] = []
    try:
        client = await connect(url, None, errors)
    except Exception as exc:  # the server's refusal arrives as some connection error
        return {"connected": False, "error": f"{type(exc).__name__}: {exc}", "errors": errors}
    await client.close()
    return {"connected": True, "errors": errors}


async def count(url: str, creds: str) -> dict[str, Any]:
    client = await connect(url, creds, [])
    try:
        js = client.jetstream(timeout=10)
        out = {}
        for stream in (EVENTS_STREAM, COMMANDS_STREAM):
            info = await js.stream_info(stream)
            out[stream] = info.state.messages
        return out
    finally:
        await client.close()


async def forge(
    url: str, creds: str, credential: str, agent: str, allocation: str
) -> dict[str, Any]:
    inbox = None
    if credential != "-":
        with open(credential) as fh:
            inbox = json.load(fh).get("inbox_prefix")
    errors: list[str] = []
    client = await connect(url, creds, errors, inbox)
    forged = [
        (agent_subject(agent), {"command_id": f"kill:{allocation}:x", "kind": "kill"}),
        (agent_subject(agent), {"command_id": f"start:{allocation}:x", "kind": "start"}),
        ("cairn.evt.trial.trial-1", {"type": "TrialExited"}),
    ]
    acked, refused = [], []
    try:
        js = client.jetstream(timeout=3)
        for subject, body in forged:
            data = json.dumps({**body, "allocation_id": allocation}).encode()
            try:
                await js.publish(subject, data, headers={"Cairn-Position": "1"})
                acked.append(subject)
            except Exception as exc:  # no ack: the server dropped it
                refused.append(f"{subject}: {type(exc).__name__}")
            await client.publish(subject, data)  # and without waiting for an ack
        await client.flush()
        deadline = time.monotonic() + 10
        wanted = {subject for subject, _ in forged}
        while time.monotonic() < deadline and not all(_violated(s, errors) for s in wanted):
            await asyncio.sleep(0.05)
    finally:
        await client.close()
    return {
        "user": creds,
        "acked": acked,
        "refused": refused,
        "violated": sorted(s for s, _ in forged if _violated(s, errors)),
        "errors": errors,
    }


def _violated(subject: str, errors: list[str]) -> bool:
    return any(
        "permissions violation for publish" in e.lower() and subject.lower() in e.lower()
        for e in errors
    )


def main() -> None:
    mode, *args = sys.argv[1:]
    runs = {"connect": anonymous, "count": count, "forge": forge}
    print(json.dumps(asyncio.run(runs[mode](*args))))  # type: ignore[operator]


if __name__ == "__main__":
    main()
