"""Follows cairn's allocation facts and appends them to a CSV file, one row per event.

A standalone program: it needs only aiohttp, not cairn. It reads the live event stream
(``GET /api/v1/events/stream``, Server-Sent Events) filtered to the facts that measure usage:
an allocation granted (``SlotsAllocated``), its process started (``TrialStarted``) and exited
(``TrialExited``), and its slots released (``SlotsReleased``).

Each row holds the event's log position. On start the program reads the last complete row and
resumes right after it, so stopping it at any moment, even with ``kill -9``, neither loses nor
repeats a row: a row is written with one ``write`` call and flushed before the next event is
read, and a torn last line (a crash of the machine mid-write) is cut off and fetched again.

    python follow_usage.py --master http://127.0.0.1:8080 --out usage.csv
        [--token TOKEN | --user admin --password ...] [--experiment 7]

The token (``CAIRN_TOKEN``) or the user and password (``CAIRN_USER``, ``CAIRN_PASSWORD``) must
be an admin's, unless ``--experiment`` names one of the user's own experiments.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import signal
import sys
from typing import Any

import aiohttp

TYPES = ("SlotsAllocated", "TrialStarted", "TrialExited", "SlotsReleased")
COLUMNS = (
    "position",
    "recorded_at",
    "type",
    "trial_id",
    "allocation_id",
    "run_id",
    "agent_id",
    "slots",
    "outcome",
    "exit_code",
    "actor",
)


def resume_position(path: str) -> int:
    """Prepares ``path`` for appending and returns the position of its last complete row.

    Creates the file with a header when missing; cuts off a torn last line.
    """
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        with open(path, "w", newline="", encoding="utf-8") as out:
            out.write(",".join(COLUMNS) + "\n")
            out.flush()
            os.fsync(out.fileno())
        return 0
    with open(path, "rb+") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            f.truncate(end)
        lines = data[:end].splitlines()
    for line in reversed(lines[1:]):
        first = line.split(b",", 1)[0]
        if first.isdigit():
            return int(first)
    return 0


def row_of(event: dict[str, Any]) -> list[Any]:
    """The CSV row of one recorded event (its JSON as the stream sends it)."""
    payload = event.get("payload", {})
    placements = payload.get("placements") or {}
    agent = payload.get("agent_id") or ",".join(sorted(placements))
    slots = sum(len(v) for v in placements.values()) if placements else ""
    return [
        event["position"],
        event["recorded_at"],
        event["type"],
        payload.get("trial_id", ""),
        payload.get("allocation_id", ""),
        payload.get("run_id", ""),
        agent,
        slots,
        payload.get("outcome", ""),
        "" if payload.get("exit_code") is None else payload["exit_code"],
        (event.get("metadata") or {}).get("actor", ""),
    ]


async def login(session: aiohttp.ClientSession, master: str, user: str, password: str) -> str:
    """Exchanges a username and password for a token."""
    async with session.post(
        f"{master}/api/v1/auth/login", json={"username": user, "password": password}
    ) as resp:
        body = await resp.json()
        if resp.status != 200:
            raise SystemExit(f"login failed: {body.get('error', {}).get('message', resp.status)}")
        return str(body["token"])


async def follow(args: argparse.Namespace, stop: asyncio.Event) -> None:
    """Appends rows until ``stop`` is set, reconnecting after every lost connection."""
    after = resume_position(args.out)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        token = args.token or await login(session, args.master, args.user, args.password)
        with open(args.out, "a", newline="", encoding="utf-8") as out:
            while not stop.is_set():
                try:
                    after = await _stream(session, args, token, after, out, stop)
                except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
                    print(f"stream lost ({exc}); resuming after {after}", file=sys.stderr)
                if not stop.is_set():
                    await asyncio.sleep(1.0)


async def _stream(
    session: aiohttp.ClientSession,
    args: argparse.Namespace,
    token: str,
    after: int,
    out: io.TextIOBase,
    stop: asyncio.Event,
) -> int:
    params = {"types": ",".join(TYPES)}
    if args.experiment is not None:
        params["experiment_id"] = str(args.experiment)
    headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": str(after)}
    async with session.get(
        f"{args.master}/api/v1/events/stream", params=params, headers=headers
    ) as resp:
        if resp.status != 200:
            text = await resp.text()
            raise SystemExit(f"event stream refused ({resp.status}): {text}")
        buffer = b""
        data: list[bytes] = []
        async for chunk in resp.content.iter_any():
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.startswith(b"data:"):
                    data.append(line[5:].strip())
                elif not line.strip() and data:
                    event = json.loads(b"\n".join(data))
                    data = []
                    if event["position"] <= after:
                        continue
                    text = io.StringIO()
                    csv.writer(text, lineterminator="\n").writerow(row_of(event))
                    out.write(text.getvalue())
                    out.flush()
                    after = event["position"]
            if stop.is_set():
                break
    return after


def main() -> None:
    """Parses the flags and follows until SIGTERM or SIGINT."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--master", default=os.environ.get("CAIRN_MASTER", "http://127.0.0.1:8080"))
    p.add_argument("--out", default="usage.csv", help="the CSV file (appended to)")
    p.add_argument("--token", default=os.environ.get("CAIRN_TOKEN"))
    p.add_argument("--user", default=os.environ.get("CAIRN_USER", "admin"))
    p.add_argument("--password", default=os.environ.get("CAIRN_PASSWORD", "admin"))
    p.add_argument("--experiment", type=int, help="follow one experiment only")
    args = p.parse_args()
    args.master = args.master.rstrip("/")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        task = asyncio.create_task(follow(args, stop))
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        task.cancel()
        waiter.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())


if __name__ == "__main__":
    main()
