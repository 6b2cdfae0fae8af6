"""Looks for the cluster's credentials from inside a trial, as hostile code would, and reports
what it could reach as one ``REPORT {json}`` line.

Hyperparameters: ``data_dir`` (walked, every file read), ``victims`` (pids sent SIGTERM),
``targets`` (paths listed or read), ``hold`` (after saving a checkpoint, wait until a file
``release`` appears in the working directory).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import cairn.core

MAX_FILE = 64 << 10


def own_status() -> dict[str, str]:
    """This process's uid, gid, groups, NoNewPrivs and capability sets."""
    wanted = (
        "Uid",
        "Gid",
        "Groups",
        "NoNewPrivs",
        "CapInh",
        "CapPrm",
        "CapEff",
        "CapBnd",
        "CapAmb",
    )
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            out[key] = value.strip()
    return out


def environments() -> dict[str, Any]:
    """Every process's environment this process can read, and the errors of the rest."""
    found: dict[str, str] = {}
    refused: dict[str, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            found[entry] = Path(f"/proc/{entry}/environ").read_bytes().decode(errors="replace")
        except OSError as exc:
            refused[entry] = type(exc).__name__
    return {"read": found, "refused": refused}


def walk(root: str) -> dict[str, Any]:
    """Every file under ``root`` this process can read (their text), and what it could not."""
    texts: dict[str, str] = {}
    errors: list[str] = []
    for parent, _dirs, files in os.walk(root, onerror=lambda e: errors.append(str(e))):
        for name in files:
            path = os.path.join(parent, name)
            try:
                with open(path, "rb") as fh:
                    texts[path] = fh.read(MAX_FILE).decode(errors="replace")
            except OSError as exc:
                errors.append(f"{path}: {type(exc).__name__}")
    return {"files": texts, "errors": errors}


def attempts(targets: list[str]) -> dict[str, str]:
    """Lists or reads each target; what happened to each."""
    out = {}
    for target in targets:
        try:
            if os.path.isdir(target):
                out[target] = "listed " + ",".join(sorted(os.listdir(target)))
            else:
                out[target] = "read " + Path(target).read_text()[:100]
        except OSError as exc:
            out[target] = type(exc).__name__
    return out


def signals(victims: list[int]) -> dict[str, str]:
    """Sends SIGTERM to each pid; ``sent`` or the error's name."""
    out = {}
    for pid in victims:
        try:
            os.kill(pid, signal.SIGTERM)
            out[str(pid)] = "sent"
        except OSError as exc:
            out[str(pid)] = type(exc).__name__
    return out


def main() -> None:
    """Saves a checkpoint, looks around, reports, and holds when asked to."""
    with cairn.core.init() as ctx:
        hp = ctx.info.trial.hparams
        with ctx.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
            (path / "secret.txt").write_text(f"only {os.getuid()} may read this")
            checkpoint = str(path)
        Path("secret-work.txt").write_text("work of this trial")
        report = {
            "pid": os.getpid(),
            "cwd": os.getcwd(),
            "home": os.environ.get("HOME"),
            "user": os.environ.get("USER"),
            "tmpdir": os.environ.get("TMPDIR"),
            "checkpoint": checkpoint,
            "checkpoint_uuid": uuid,
            "status": own_status(),
            "environments": environments(),
            "data_dir": walk(str(hp["data_dir"])),
            "attempts": attempts(list(hp.get("targets") or [])),
            "signals": signals([int(p) for p in hp.get("victims") or []]),
        }
        print("REPORT " + json.dumps(report), flush=True)
        ctx.train.report_validation_metrics(1, {"validation_loss": 1.0})
        if hp.get("hold"):
            deadline = time.monotonic() + 300
            while not os.path.exists("release") and time.monotonic() < deadline:
                time.sleep(0.1)


if __name__ == "__main__":
    main()
