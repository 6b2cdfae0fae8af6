"""The chaos driver: a seeded ASHA search on the embedded cluster while faults are injected.

:class:`Local` drives one embedded cluster (``cairn up``) through the CLI and reads its log;
:func:`asha_config` is the seeded search; each injector in :data:`INJECTORS` causes one fault,
proves that it happened (an exit by SIGKILL and a new pid, a process state ``stopped``, a JetStream
stream that went back in time, a new supervisor) and measures how long the component took to be
back and to write again. :func:`run_experiment` runs one search, with or without faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import yaml

from tests.helpers import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED = ROOT / "examples" / "scripted"
UP_ARGS = ("up", "--slots", "2", "--api-port", "0", "--stop-timeout", "3")

DECIDERS = ("relay", "searcher", "scheduler")
"""Services that lead through a lease (see ``events/log/lease.py``)."""

DECISIONS = {
    "searcher": ("TrialRequested", "TrialStopRequested", "ExperimentStateChanged"),
    "scheduler": ("SlotsAllocated", "SlotsReleased"),
}
"""Event types each decider appends: its next one after a fault shows it deciding again."""

REPORTS = (
    "TrialStarted",
    "TrialExited",
    "WorkloadCompleted",
    "ValidationReported",
    "CheckpointSaved",
)
"""Event types the API appends on behalf of agents and trials."""

BACK_TIMEOUT = 90.0
"""Seconds a component gets to come back after a fault before the run counts it as lost."""

LIVE_TIMEOUT = 15.0
"""Seconds to watch a checkpoint move after a fault (no later record of it remains)."""


class ChaosError(AssertionError):
    """A fault could not be injected or its effect could not be confirmed."""


# --------------------------------------------------------------------------- the cluster


@dataclass
class Local:
    """An embedded cluster: its home directory (``CAIRN_HOME``)."""

    home: Path

    def cli(self, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
        """Runs ``python -m cairn ARGS`` against this cluster."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("CAIRN_HOME", "CAIRN_MASTER", "CAIRN_USER", "CAIRN_PASSWORD")
        }
        env.update({"PYTHONPATH": str(ROOT), "CAIRN_HOME": str(self.home)})
        return subprocess.run(
            [sys.executable, "-m", "cairn", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, *args: str, timeout: float = 150) -> str:
        """Runs the CLI and requires exit 0; returns its standard output."""
        done = self.cli(*args, timeout=timeout)
        if done.returncode != 0:
            raise ChaosError(f"{args} -> {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def json(self, *args: str, timeout: float = 60) -> Any:
        """``cairn --json ARGS``, parsed."""
        return json.loads(self.ok("--json", *args, timeout=timeout))

    def up(self) -> None:
        """``cairn up`` with two CPU slots on a free API port."""
        self.ok(*UP_ARGS)

    def down(self) -> None:
        """``cairn down``."""
        self.cli("down", timeout=90)

    def status(self) -> dict[str, Any]:
        """What ``cairn --json status`` prints, read in this process (polled often)."""
        from cairn.local.status import describe

        return describe(self.home)

    def processes(self) -> dict[str, dict[str, Any]]:
        """The supervised processes by name."""
        return {p["name"]: p for p in self.status()["processes"]}

    def recorded(self) -> dict[str, Any]:
        """``cluster.json`` as the supervisor wrote it (``status`` masks the passwords)."""
        state: dict[str, Any] = json.loads((self.home / "cluster.json").read_text())
        return state

    @property
    def dsn(self) -> str:
        """The log's DSN (with its password)."""
        return str(self.recorded()["dsn"])

    @property
    def nats_url(self) -> str:
        """The bus's URL (with its password)."""
        return str(self.recorded()["nats_url"])

    def query(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        """Runs one query on the log's database on a connection of its own."""
        return asyncio.run(_fetch(self.dsn, sql, *args))

    def value(self, sql: str, *args: Any) -> Any:
        """The first column of the first row of ``sql`` (``None`` if it returns nothing)."""
        rows = self.query(sql, *args)
        return rows[0][0] if rows else None

    def try_value(self, sql: str, *args: Any) -> Any:
        """:meth:`value`, or ``None`` while the database cannot be reached."""
        try:
            return self.value(sql, *args)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return None


async def _fetch(dsn: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.set_type_codec(
            "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def asha_config(
    path: Path, seed: int, *, trials: int = 16, steps: int = 40, step_s: float = 0.05
) -> Path:
    """The scripted example as a seeded adaptive ASHA search of short, checkpointing trials.

    ``validation_offset`` is searched, so the best trial is a property of the hyperparameters
    alone and does not depend on the order in which reports arrive. ``step_s`` is each step's
    sleep: it sets how long the search lasts, hence how many faults land while it runs.
    """
    config = yaml.safe_load((SCRIPTED / "config.yaml").read_text())
    config["hyperparameters"].update(
        steps=steps,
        report_every=5,
        checkpoint_every=10,
        sleep=step_s,
        width={"type": "int", "minval": 1, "maxval": 1000},
        validation_offset={"type": "double", "minval": 0.0, "maxval": 1.0},
    )
    config["searcher"] = {
        "name": "adaptive_asha",
        "metric": "validation_loss",
        "smaller_is_better": True,
        "max_trials": trials,
        "max_concurrent_trials": 4,
        "time_metric": "batches",
        "max_time": steps,
    }
    config["max_restarts"] = 5
    config["reproducibility"] = {"experiment_seed": seed}
    path.write_text(yaml.safe_dump(config))
    return path


def created_id(stdout: str) -> int:
    """The id in ``created experiment N``."""
    for line in stdout.splitlines():
        if line.startswith("created experiment"):
            return int(line.split()[2].rstrip(";"))
    raise ChaosError(f"no experiment id in {stdout!r}")


def experiment_state(local: Local, exp_id: int) -> str | None:
    """The experiment's state as the log says (``None`` while the log cannot be read)."""
    state = local.try_value(
        """SELECT payload->>'state' FROM events
           WHERE stream_id = $1 AND type = 'ExperimentStateChanged'
           ORDER BY stream_version DESC LIMIT 1""",
        f"experiment-{exp_id}",
    )
    return str(state) if state is not None else "ACTIVE"


# --------------------------------------------------------------------------- faults


@dataclass
class Fault:
    """One injected fault and what it did.

    Attributes:
        kind: what was done (``kill``, ``stop``, ``nats-rollback``, ``down-up``).
        target: the component it was done to.
        at: seconds since the experiment was created.
        evidence: how the driver saw that the fault happened.
        back_s: seconds from the fault to the component running again (``None``: never).
        write_s: seconds from the fault to the component's next write (``None``: none seen; it
            may have had nothing left to do).
        during_search: whether the experiment was still running when the fault was injected.
        error: why the fault could not be shown to have happened or the component did not
            come back (empty when all is well).
    """

    kind: str
    target: str
    at: float = 0.0
    evidence: str = ""
    back_s: float | None = None
    write_s: float | None = None
    during_search: bool = True
    error: str = ""
    probes: dict[str, Probe] = field(default_factory=dict)
    """Log queries for ``back_s``/``write_s`` answered once the run is over (see :func:`settle`)."""

    @property
    def label(self) -> str:
        """``kind:target``."""
        return f"{self.kind}:{self.target}"


@dataclass(frozen=True)
class Probe:
    """A query for the first timestamp at or after ``since`` (epoch seconds) of something."""

    since: float
    sql: str
    args: tuple[Any, ...]

    def seconds(self, local: Local) -> float | None:
        """Seconds from ``since`` to the answer (``None`` when there is none)."""
        return _seconds(local.try_value(self.sql, *self.args), self.since)


def settle(local: Local, faults: Sequence[Fault]) -> None:
    """Answers the faults' deferred probes from the log, once the run is over."""
    for fault in faults:
        for attr, probe in fault.probes.items():
            setattr(fault, attr, probe.seconds(local))


def _since(start: float) -> float:
    return round(time.time() - start, 2)


def _alive_again(local: Local, name: str, before: dict[str, Any]) -> dict[str, Any] | None:
    now: dict[str, Any] | None = local.processes().get(name)
    if now is None or now["pid"] == before["pid"] or now["restarts"] <= before["restarts"]:
        return None
    return now if now["state"] == "alive" else None


def kill_and_confirm(local: Local, name: str, timeout: float = BACK_TIMEOUT) -> dict[str, Any]:
    """SIGKILLs supervised process ``name``; returns its new record once the supervisor saw it
    die by SIGKILL and the new process is alive (for a service: ready).

    Raises:
        ChaosError: it was not restarted in time, or its recorded exit was not a SIGKILL.
    """
    before = local.processes()[name]
    os.kill(before["pid"], signal.SIGKILL)
    try:
        now: dict[str, Any] = wait_until_sync(
            lambda: _alive_again(local, name, before), timeout, every=0.1
        )
    except AssertionError as exc:
        raise ChaosError(f"{name} was not back: {local.processes().get(name)}") from exc
    if now["exit_code"] != -signal.SIGKILL:
        raise ChaosError(f"{name} exit code {now['exit_code']}, not -9: {now}")
    now["killed_pid"] = before["pid"]
    return now


def _first_after(local: Local, sql: str, *args: Any, timeout: float = LIVE_TIMEOUT) -> Any:
    """Polls ``sql`` (one timestamp or NULL) until it is not NULL; ``None`` on timeout."""
    with contextlib.suppress(AssertionError):
        return wait_until_sync(lambda: local.try_value(sql, *args), timeout, every=0.2)
    return None


def _seconds(found: Any, start: float) -> float | None:
    return None if found is None else round(max(found.timestamp() - start, 0.0), 2)


CHECKPOINTS = {"relay": "relay", "nats": "relay", "tracker": "tracker-projections"}
"""Components whose writes show only as a consumer checkpoint moving (not kept in the log)."""


def write_probe(component: str, since: float, *, pid: int | None = None) -> Probe:
    """The query for when ``component`` next wrote after ``since`` (epoch seconds).

    Deciders that restarted (``pid`` given) count from their ``LeaderElected``, a paused one from
    its next decision; the tracker and the relay from their checkpoint moving (nats: the relay
    publishing again); the API from the next report it appended; the agent from the next report
    of a run; PostgreSQL from the next event committed.
    """
    at = _stamp(since)
    if component in DECIDERS and pid is not None:
        return Probe(
            since,
            """SELECT min(recorded_at) FROM events WHERE stream_id = $1
               AND type = 'LeaderElected' AND payload->>'holder' LIKE $2 AND recorded_at >= $3""",
            (f"lease-{component}", f"%:{pid}", at),
        )
    if component in DECISIONS:
        return Probe(
            since,
            "SELECT min(recorded_at) FROM events WHERE type = ANY($1) AND recorded_at >= $2",
            (list(DECISIONS[component]), at),
        )
    if component in CHECKPOINTS:
        return Probe(
            since,
            "SELECT updated_at FROM checkpoints WHERE name = $1 AND updated_at >= $2",
            (CHECKPOINTS[component], at),
        )
    types = {"api": REPORTS, "agent": ("TrialStarted", "TrialExited")}.get(component)
    return Probe(
        since,
        "SELECT min(recorded_at) FROM events WHERE ($1::text[] IS NULL OR type = ANY($1))"
        " AND recorded_at >= $2",
        (list(types) if types else None, at),
    )


def measure_write(
    local: Local, fault: Fault, component: str, since: float, pid: int | None = None
) -> None:
    """Sets ``fault.write_s`` now for checkpoint writers (watched for :data:`LIVE_TIMEOUT`
    seconds), or leaves a probe that :func:`settle` answers from the log after the run."""
    probe = write_probe(component, since, pid=pid)
    if component in CHECKPOINTS and not (component in DECIDERS and pid is not None):
        found = _first_after(local, probe.sql, *probe.args, timeout=LIVE_TIMEOUT)
        fault.write_s = _seconds(found, since)
    else:
        fault.probes["write_s"] = probe


def _stamp(epoch: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC)


def inject_kill(local: Local, fault: Fault, rng: random.Random) -> None:
    """SIGKILL of a supervised service or server; proven by exit -9 and a new pid."""
    start = time.time()
    now = kill_and_confirm(local, fault.target)
    fault.back_s = _since(start)
    fault.evidence = f"exit {now['exit_code']}, pid {now['killed_pid']} -> {now['pid']}"
    pid = int(now["pid"]) if fault.target in DECIDERS else None
    measure_write(local, fault, fault.target, start, pid)


def _run_records(local: Local) -> list[dict[str, Any]]:
    records = []
    for path in sorted((local.home / "agent" / "run-processes").glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            records.append(json.loads(path.read_text()))
    return records


def _live_run(local: Local) -> tuple[str, int] | None:
    for record in _run_records(local):
        for group in record.get("groups", []):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(int(group["pid"]))
                if proc.status() != psutil.STATUS_ZOMBIE:
                    return str(record["allocation_id"]), proc.pid
    return None


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def inject_kill_trial(local: Local, fault: Fault, rng: random.Random) -> None:
    """SIGKILL of a running trial process; proven by its exit recorded with code -9."""
    try:
        allocation, pid = wait_until_sync(lambda: _live_run(local), 60, every=0.1)
    except AssertionError as exc:
        raise ChaosError("no trial process ran within 60s") from exc
    trial = local.value(
        "SELECT payload->>'trial_id' FROM events WHERE type = 'SlotsAllocated'"
        " AND payload->>'allocation_id' = $1",
        allocation,
    )
    start = time.time()
    os.kill(pid, signal.SIGKILL)
    wait_until_sync(lambda: _gone(pid), 30, every=0.05)
    try:
        exit_code = wait_until_sync(
            lambda: local.try_value(
                "SELECT coalesce(payload->>'exit_code', 'none') FROM events"
                " WHERE type = 'TrialExited' AND payload->>'allocation_id' = $1",
                allocation,
            ),
            BACK_TIMEOUT,
            every=0.2,
        )
    except AssertionError as exc:
        raise ChaosError(f"no TrialExited for allocation {allocation}") from exc
    fault.target = "trial"
    fault.evidence = f"trial {trial} pid {pid} ({allocation}) exited {exit_code}"
    if exit_code not in (str(-signal.SIGKILL), str(128 + signal.SIGKILL)):
        raise ChaosError(f"{fault.evidence}: expected exit by SIGKILL")
    restarted = Probe(
        start,
        "SELECT min(recorded_at) FROM events WHERE type = 'TrialStarted'"
        " AND payload->>'trial_id' = $1 AND recorded_at >= $2",
        (trial, _stamp(start)),
    )
    fault.probes.update(back_s=restarted, write_s=restarted)


def _state(pid: int) -> str:
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return "gone"


def _elections(local: Local, lease: str) -> list[str]:
    rows = local.query(
        "SELECT payload->>'holder' FROM events WHERE stream_id = $1 ORDER BY stream_version",
        f"lease-{lease}",
    )
    return [str(r[0]) for r in rows]


def _leading_pid(local: Local, name: str) -> int | None:
    """The pid of the supervised replica of ``name`` if it is alive and the latest elected."""
    proc = local.processes()[name]
    if proc["state"] != "alive":
        return None
    last = _elections(local, name)[-1:]
    return int(proc["pid"]) if last and last[0].endswith(f":{proc['pid']}") else None


def _pause_leader(local: Local, name: str) -> int:
    """SIGSTOPs the replica of ``name`` that leads (a replica restarted by an earlier fault may
    still wait for the lease, or be on its way out); returns its pid once it is stopped."""
    deadline = time.monotonic() + BACK_TIMEOUT
    while True:
        try:
            pid = wait_until_sync(lambda: _leading_pid(local, name), BACK_TIMEOUT, every=0.2)
            os.kill(pid, signal.SIGSTOP)
            break
        except ProcessLookupError:  # it exited between the look and the signal: look again
            if time.monotonic() > deadline:
                raise ChaosError(f"no {name} leader stayed alive to be paused") from None
        except AssertionError as exc:
            raise ChaosError(f"no {name} replica led within {BACK_TIMEOUT:.0f}s") from exc
    try:
        wait_until_sync(lambda: _state(pid) == psutil.STATUS_STOPPED, 10, every=0.02)
    except AssertionError as exc:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        raise ChaosError(f"{name} pid {pid} is {_state(pid)}, not stopped") from exc
    return pid


def start_standby(local: Local, name: str, log_path: Path) -> subprocess.Popen[bytes]:
    """Starts another replica of decider ``name`` on the cluster (it waits for the lease), as
    the supervisor starts one: as the decider's role, with its credential files."""
    from cairn.local.environment import child_env
    from cairn.local.service_credentials import DB_FILE, NATS_FILE, SECRETS_DIR, service_env

    files = local.home / SECRETS_DIR / name
    env = service_env(
        child_env(),
        {"CAIRN_DB_FILE": str(files / DB_FILE), "CAIRN_NATS_FILE": str(files / NATS_FILE)},
    )
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", f"services.{name}"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=local.home,
            start_new_session=True,
        )


def stop_standby(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it lingers."""
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def inject_stop(local: Local, fault: Fault, rng: random.Random) -> None:
    """SIGSTOP of a leader for a few seconds, then SIGCONT; proven by its process state.

    A standby replica of the same decider runs meanwhile; the evidence says whether it was
    elected while the leader was paused (it is not while the paused leader's database session,
    hence its advisory lock, stays open).
    """
    name = fault.target
    pid = _pause_leader(local, name)
    elected = len(_elections(local, name))
    standby_log = local.home / "logs" / f"{name}-standby.log"
    standby = start_standby(local, name, standby_log)
    try:
        with contextlib.suppress(AssertionError):  # up and trying for the lease (or not: below)
            wait_until_sync(lambda: b"ready" in standby_log.read_bytes(), 30, every=0.1)
        held = rng.uniform(2.0, 5.0)
        time.sleep(held)  # the pause is the fault: the leader stays stopped this long
        taken = _elections(local, name)[elected:]
        os.kill(pid, signal.SIGCONT)
        if standby.poll() is not None:
            raise ChaosError(f"the standby {name} exited with {standby.returncode}")
        resumed = time.time()
        wait_until_sync(lambda: _state(pid) != psutil.STATUS_STOPPED, 10, every=0.02)
        after = local.processes()[name]
        how = "continued" if after["pid"] == pid else f"restarted as pid {after['pid']}"
        by = f"standby {standby.pid} elected" if taken else f"standby {standby.pid} not elected"
        fault.evidence = f"leader pid {pid} stopped {held:.1f}s ({by}), then {how}"
        fault.back_s = 0.0
        measure_write(local, fault, name, resumed)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        stop_standby(standby)


def _stream_last_seq(local: Local) -> int:
    from events.log.bus import EVENTS_STREAM, connect_options

    async def last() -> int:
        import nats

        nc = await nats.connect(
            **connect_options(local.nats_url), connect_timeout=5, max_reconnect_attempts=0
        )
        try:
            info = await nc.jetstream().stream_info(EVENTS_STREAM)
            return int(info.state.last_seq)
        finally:
            await nc.close()

    return asyncio.run(last())


@dataclass
class NatsCopy:
    """A copy of the JetStream store taken while the search ran (for :func:`inject_rollback`)."""

    path: Path
    last_seq: int = 0


def copy_nats_store(local: Local, into: Path) -> NatsCopy:
    """Copies the JetStream store with nats-server paused for the copy (a consistent image)."""
    seq = _stream_last_seq(local)
    pid = int(local.processes()["nats"]["pid"])
    os.kill(pid, signal.SIGSTOP)
    try:
        shutil.copytree(local.home / "nats", into)
    finally:
        os.kill(pid, signal.SIGCONT)
    return NatsCopy(into, seq)


def inject_rollback(local: Local, fault: Fault, rng: random.Random, old: NatsCopy) -> None:
    """Restarts nats-server on an older copy of its store; proven by a new pid and a stream
    whose last sequence went back.

    The supervisor is paused while nats-server is killed and its store replaced, so that it
    restarts the server (same port, config and password) on the old copy.
    """
    before_seq = _stream_last_seq(local)
    supervisor = int(local.status()["supervisor_pid"])
    before = local.processes()["nats"]
    start = time.time()
    os.kill(supervisor, signal.SIGSTOP)
    try:
        os.kill(before["pid"], signal.SIGKILL)
        wait_until_sync(lambda: _gone(before["pid"]), 30, every=0.05)
        store = local.home / "nats"
        shutil.rmtree(store)
        shutil.copytree(old.path, store)
    finally:
        os.kill(supervisor, signal.SIGCONT)
    try:
        wait_until_sync(lambda: _alive_again(local, "nats", before), BACK_TIMEOUT, every=0.1)
    except AssertionError as exc:
        raise ChaosError(f"nats was not back: {local.processes().get('nats')}") from exc
    fault.back_s = _since(start)
    after_seq = _stream_last_seq(local)
    now = local.processes()["nats"]
    fault.evidence = (
        f"pid {before['pid']} -> {now['pid']}, stream seq {before_seq} -> {after_seq} "
        f"(copy at {old.last_seq})"
    )
    if after_seq < before_seq:
        measure_write(local, fault, "nats", start)
        return
    # The relay may have found the bus behind its checkpoint and published the lost tail again
    # before the stream was read: its own record of that is then the proof of the rollback.
    try:
        rewind = wait_until_sync(lambda: relay_rewind_since(local, start), 30, every=0.1)
    except AssertionError as exc:
        raise ChaosError(f"{fault.evidence}: the stream did not go back") from exc
    fault.evidence += (
        f"; the relay found the bus at position {rewind['bus_position']} behind its "
        f"checkpoint {rewind['checkpoint']} and published the tail again"
    )
    measure_write(local, fault, "nats", start)


REWIND_EVENT = "the bus lost relayed events; publishing them again"
"""What the relay logs when it finds the bus behind its checkpoint (events.log.relay)."""


def relay_rewind_since(local: Local, start: float) -> dict[str, Any] | None:
    """The relay's last record, logged after ``start`` (epoch seconds), of finding the bus
    behind its checkpoint, if any."""
    found = None
    for path in sorted((local.home / "logs").glob("relay*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if REWIND_EVENT not in line:
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError):
                record = json.loads(line)
                at = datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
                if record["event"] == REWIND_EVENT and at.timestamp() >= start:
                    found = record
    return found


def inject_down_up(local: Local, fault: Fault, rng: random.Random) -> None:
    """``cairn down`` then ``cairn up``; proven by every process and the supervisor being new."""
    before = local.status()
    start = time.time()
    local.down()
    stopped = local.status()
    if stopped["running"] or any(p["alive"] for p in stopped["processes"]):
        raise ChaosError(f"cairn down left processes running: {stopped}")
    local.up()
    after = local.status()
    fault.back_s = _since(start)
    old = {p["name"]: p["pid"] for p in before["processes"]}
    same = [p["name"] for p in after["processes"] if old.get(p["name"]) == p["pid"]]
    if not after["healthy"] or same or after["supervisor_pid"] == before["supervisor_pid"]:
        raise ChaosError(f"cairn up did not start a new cluster: {after}")
    fault.evidence = f"supervisor {before['supervisor_pid']} -> {after['supervisor_pid']}"
    measure_write(local, fault, "agent", time.time())  # its exits at shutdown do not count


Injector = Callable[[Local, Fault, random.Random], None]

INJECTORS: dict[str, Injector] = {
    "kill": inject_kill,
    "kill-trial": inject_kill_trial,
    "stop": inject_stop,
    "down-up": inject_down_up,
}

KILLED = ("relay", "searcher", "scheduler", "tracker", "api", "agent", "nats", "postgres")
"""Supervised processes the full plan SIGKILLs."""


def full_plan(rng: random.Random) -> list[Fault]:
    """Every fault of the chaos suite, in a seeded random order."""
    plan = [Fault("kill", name) for name in KILLED]
    plan += [
        Fault("kill-trial", "trial"),
        Fault("stop", rng.choice(DECIDERS)),
        Fault("nats-rollback", "nats"),
        Fault("down-up", "cluster"),
    ]
    rng.shuffle(plan)
    return plan


def short_plan(rng: random.Random) -> list[Fault]:
    """A SIGKILL of every supervised process and of a trial, in a seeded random order: each
    component class (deciders, projections, gateway, agent, trial, bus, database) once."""
    plan = [Fault("kill", name) for name in KILLED] + [Fault("kill-trial", "trial")]
    rng.shuffle(plan)
    return plan


@dataclass
class Run:
    """One experiment run: its id, seconds to the end, and the faults injected into it."""

    exp_id: int
    seconds: float = 0.0
    faults: list[Fault] = field(default_factory=list)
    state: str = ""


def run_experiment(
    local: Local,
    config: Path,
    seed: int,
    plan: Sequence[Fault] = (),
    *,
    scratch: Path,
    timeout: float = 300.0,
    gap: tuple[float, float] = (0.2, 1.5),
) -> Run:
    """Creates the experiment, injects ``plan`` at seeded random moments, waits for its end.

    Faults are injected one after another, each after a random gap once the previous one's
    component is back. A NATS rollback uses a copy of the store taken right after creation.
    """
    rng = random.Random(seed)
    run = Run(created_id(local.ok("experiment", "create", str(config), str(SCRIPTED))))
    created = time.monotonic()
    nats_copy: NatsCopy | None = None
    if any(f.kind == "nats-rollback" for f in plan):
        time.sleep(rng.uniform(0.5, 2.0))  # some of the search is in the copy, more is not
        nats_copy = copy_nats_store(local, scratch / f"nats-copy-{seed}")
    for fault in plan:
        time.sleep(rng.uniform(*gap))  # a random moment of the search, not a wait for state
        fault.at = round(time.monotonic() - created, 2)
        fault.during_search = experiment_state(local, run.exp_id) == "ACTIVE"
        try:
            if fault.kind == "nats-rollback":
                assert nats_copy is not None
                inject_rollback(local, fault, rng, nats_copy)
            else:
                INJECTORS[fault.kind](local, fault, rng)
        except (ChaosError, AssertionError, OSError) as exc:
            fault.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        run.faults.append(fault)
    left = max(timeout - (time.monotonic() - created), 10.0)
    with contextlib.suppress(subprocess.TimeoutExpired):
        local.cli("experiment", "wait", "--polling-interval", "0.5", str(run.exp_id), timeout=left)
    run.seconds = round(time.monotonic() - created, 1)
    settle(local, run.faults)
    run.state = experiment_state(local, run.exp_id) or "unknown"
    if run.state == "ACTIVE":
        run.state = f"still ACTIVE after {run.seconds:.0f}s"
    return run
