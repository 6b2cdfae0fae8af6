"""The compose cluster as a security boundary: user code never shares a container with the Docker
socket and runs unprivileged; a config cannot mount a host path the cluster did not allow; NATS
refuses anonymous clients, is not published, and obeys no command forged with a service's or an
agent's credentials; no container holds a secret in its environment or command line, and each
holds only its own secret files."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.agent.docker_runtime import LABEL_AGENT, LABEL_ALLOCATION, LABEL_TRIAL
from services.compose_secrets import NATS_SERVERS, NATS_URL
from tests.helpers import wait_until_sync as wait_until
from tests.lab.compose import PROJECT, Lab

PROBE_DIR = Path(__file__).parent / "probe"
ZERO_CAPS = "0000000000000000"
WORK_DIR = "/var/lib/cairn-agent"

OWN_SECRETS = {
    "postgres": {"postgres": {"password"}},
    "migrate": {"migrate": {"db"}, "db": None},
    "nats": {"nats": {"nats.conf"}},
    "relay": {"relay": {"nats", "relay.creds"}, "db/relay": {"db", "db.password"}},
    "searcher": {"searcher": {"nats", "searcher.creds"}, "db/searcher": {"db", "db.password"}},
    "scheduler": {
        "scheduler": {"nats", "scheduler.creds"},
        "db/scheduler": {"db", "db.password"},
    },
    "tracker": {"tracker": {"nats", "tracker.creds"}, "db/tracker": {"db", "db.password"}},
    "api": {
        "api": {
            "nats",
            "api.creds",
            "authority.json",
            "join.token",
            "admin.password",
            "metrics.token",
        },
        "db/api": {"db", "db.password"},
    },
    "agent": {"agent": {"join.token"}},
}
"""Each container's directories of the secrets directory and the files it finds in each (the
migrate job writes every service's login, so it holds the whole ``db`` directory)."""


def service_of(container: Any) -> str:
    """The compose service of a container, replicas and numbered agents folded together."""
    name = str(container.labels["com.docker.compose.service"])
    return re.sub(r"-(standby|\d+)$", "", name)


@dataclass
class Probe:
    """The probe trial, held in its container until released."""

    experiment_id: int
    trial_id: int
    container: Any
    report: dict[str, Any]


@pytest.fixture(scope="module")
def probe(docker_engine: Any, lab: Lab) -> Probe:
    """The probe experiment (no ``environment.image``), once its trial has reported and while
    it waits to be released."""
    created = lab.cli("experiment", "create", str(PROBE_DIR / "probe.yaml"), str(PROBE_DIR))
    experiment_id = int(created["id"])

    def reported() -> tuple[int, dict[str, Any]] | None:
        for row in lab.cli("experiment", "list-trials", str(experiment_id))["trials"]:
            trial_id = int(row["trial_id"])
            for entry in lab.cli("trial", "logs", str(trial_id))["logs"]:
                if entry["line"].startswith("PROBE "):
                    return trial_id, json.loads(entry["line"].removeprefix("PROBE "))
        return None

    found = wait_until(reported, timeout=300, every=1.0)
    trial_id, report = found
    (container,) = docker_engine.containers.list(filters={"label": f"{LABEL_TRIAL}={trial_id}"})
    return Probe(experiment_id, trial_id, container, report)


def test_a_trial_without_an_image_runs_in_its_own_container_without_socket_or_privileges(
    docker_engine: Any, lab: Lab, probe: Probe
) -> None:
    """A trial whose config names no image runs in a container of the default image, as a
    non-root uid with no capabilities and no new privileges, given only the agent's work and
    checkpoint volumes: no engine socket in its filesystem, none it can connect to, no engine on
    its gateway, no cluster credential in its environment."""
    attrs = probe.container.attrs
    assert attrs["Config"]["Image"] == "cairn-trial:local"
    agent = probe.container.labels[LABEL_AGENT]
    (agent_container,) = lab.containers(docker_engine, agent)
    assert agent_container.id != probe.container.id
    uid, _, gid = str(attrs["Config"]["User"]).partition(":")
    assert int(uid) > 65535 and int(gid) > 65535
    host = attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert not host["Privileged"] and not host["Devices"]
    mounts = {(m["Type"], m.get("Name"), m["Destination"]) for m in attrs["Mounts"]}
    assert mounts == {
        ("volume", f"{PROJECT}_{agent}", WORK_DIR),
        ("volume", f"{PROJECT}_checkpoints", "/checkpoints"),
    }
    # What the trial itself found.
    report = probe.report
    assert report["in_container"] and report["cwd"].startswith(f"{WORK_DIR}/allocations/")
    status = report["status"]
    assert set(status["Uid"].split()) == {uid} and set(status["Gid"].split()) == {gid}
    assert report["groups"] in ([], [int(gid)])
    assert status["NoNewPrivs"] == "1"
    assert {status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {ZERO_CAPS}
    assert report["sockets"] == [], report["sockets"]
    assert report["engine"] and all(
        answer.startswith("refused") for answer in report["engine"].values()
    ), report["engine"]
    assert report["tcp"] and all(a.startswith("refused") for a in report["tcp"].values())
    assert report["docker_host"] is None
    assert not [m for m in report["mounts"] if m.startswith("/run/secrets") or "docker" in m]
    leaked = {"CAIRN_DB", "CAIRN_DB_FILE", "CAIRN_NATS", "CAIRN_NATS_FILE", "CAIRN_AGENT_TOKEN",
              "CAIRN_JOIN_TOKEN_FILE", "CAIRN_ADMIN_PASSWORD", "CAIRN_ADMIN_PASSWORD_FILE",
              "CAIRN_NATS_AUTHORITY_FILE"}  # fmt: skip
    assert not leaked & set(report["env"])


def test_commands_forged_with_a_services_or_an_agents_credentials_are_refused(
    docker_engine: Any, lab: Lab, probe: Probe
) -> None:
    """A ``kill`` and a ``start`` (and an event) published with the scheduler's NATS user and
    with the probe's own agent's user are refused by the server: no stream grows, and the probe
    trial keeps running."""
    admin = f"{lab.secrets_dir / 'nats-auth' / 'admin.creds'}:/admin.creds:ro"
    url = NATS_URL
    before = lab.bus_probe(lab.in_network(admin), "count", url, "/admin.creds")
    agent = probe.container.labels[LABEL_AGENT]
    allocation = probe.container.labels[LABEL_ALLOCATION]
    (scheduler,) = lab.containers(docker_engine, "scheduler")
    (agent_container,) = lab.containers(docker_engine, agent)
    as_scheduler = lab.bus_probe(
        ["docker", "exec", "-i", scheduler.name],
        "forge", url, "/run/secrets/cairn/scheduler.creds", "-", agent, allocation,
    )  # fmt: skip
    as_agent = lab.bus_probe(
        ["docker", "exec", "-i", agent_container.name],
        "forge", url, f"{WORK_DIR}/nats.creds", f"{WORK_DIR}/credential.json", agent, allocation,
    )  # fmt: skip
    forged = {f"cairn.cmd.agent.{agent}", "cairn.evt.trial.trial-1"}
    for attempt in (as_scheduler, as_agent):
        assert attempt["acked"] == [], attempt
        assert len(attempt["refused"]) == 3, attempt
        assert set(attempt["violated"]) == forged, attempt  # the server said no, to each
    after = lab.bus_probe(lab.in_network(admin), "count", url, "/admin.creds")
    assert after == before
    probe.container.reload()
    assert probe.container.status == "running"


def test_nats_refuses_anonymous_clients_and_is_not_published(docker_engine: Any, lab: Lab) -> None:
    """No NATS server of the cluster publishes a port on the host, and a client without
    credentials inside the compose network is refused at connect time by each of them (the same
    probe with the admin's credentials gets in)."""
    admin = f"{lab.secrets_dir / 'nats-auth' / 'admin.creds'}:/admin.creds:ro"
    for server in NATS_SERVERS:
        (nats,) = lab.containers(docker_engine, server)
        assert not nats.attrs["HostConfig"]["PortBindings"]
        assert not any(nats.attrs["NetworkSettings"]["Ports"].values())
        url = f"nats://{server}:4222"
        refused = lab.bus_probe(lab.in_network(), "connect", url)
        assert refused["connected"] is False, refused
        assert "authorization" in (refused["error"] + " ".join(refused["errors"])).lower(), refused
        counted = lab.bus_probe(lab.in_network(admin), "count", url, "/admin.creds")
        assert counted  # the control: a client with a credential connects


def test_a_bind_mount_outside_the_allowed_roots_is_a_400(lab: Lab) -> None:
    """A config mounting the host's root or its Docker socket is refused at submission with a
    400 naming the field: the lab's cluster config allows no host path."""
    config = {
        "name": "mount",
        "entrypoint": "python3 probe.py",
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": 1},
    }
    for host_path in ("/", "/var/run/docker.sock"):
        mounts = [{"host_path": host_path, "container_path": "/host"}]
        status, data = lab.api(
            "POST", "/experiments", {"config": {**config, "bind_mounts": mounts}}
        )
        assert status == 400, data
        assert data["error"]["path"] == "bind_mounts[0].host_path", data
        assert f"{host_path} is outside the allowed roots" in data["error"]["message"]


def test_no_container_holds_a_secret_in_its_environment_or_command_line(
    docker_engine: Any, lab: Lab
) -> None:
    """No container of the cluster (the migrate job included) nor image has a database
    password, the admin password, the join token, an agent's token or a NATS seed in its
    environment, command line or configuration."""
    found = lab.secret_values(docker_engine)
    assert len(found) > 15, sorted(found)  # every secret this test looks for was found
    containers = lab.containers(docker_engine)
    assert {service_of(c) for c in containers} == set(OWN_SECRETS)
    images = {c.attrs["Image"] for c in containers} | {lab.values["CAIRN_TRIAL_IMAGE"]}
    exposed = {f"container {c.name}": json.dumps(c.attrs["Config"]) for c in containers}
    exposed |= {
        f"image {i}": json.dumps(docker_engine.images.get(i).attrs["Config"]) for i in images
    }
    for where, text in exposed.items():
        for name, value in found.items():
            assert value not in text, f"{name} is in the configuration of {where}"


def test_each_container_holds_only_its_own_secret_files(docker_engine: Any, lab: Lab) -> None:
    """Every container mounts, read-only, only its own directories of the secrets directory,
    and finds only its own files there; agents mount nothing else but the Docker socket, their
    work directory, the checkpoints and the cluster config."""
    root = lab.secrets_dir
    for container in lab.containers(docker_engine):
        service = service_of(container)
        expected = OWN_SECRETS[service]
        mounted = {
            str(Path(m["Source"]).relative_to(root)): m
            for m in container.attrs["Mounts"]
            if m["Type"] == "bind" and Path(m["Source"]).is_relative_to(root)
        }
        assert set(mounted) == set(expected), (container.name, sorted(mounted))
        for directory, mount in mounted.items():
            assert mount["RW"] is (service == "migrate" and directory == "db"), mount
        if container.status != "running":
            continue  # the migrate job has done its work and exited
        for directory, files in expected.items():
            assert files is not None
            inside = "/run/secrets/db" if directory.startswith("db/") else "/run/secrets/cairn"
            code, out = container.exec_run(["find", inside, "-type", "f", "-printf", "%f\\n"])
            assert code == 0, out
            assert set(out.decode().split()) == files, (container.name, out.decode())
        if service == "agent":
            targets = {m["Destination"] for m in container.attrs["Mounts"]}
            assert targets == {
                "/var/run/docker.sock", WORK_DIR, "/checkpoints", "/run/secrets/cairn",
                "/etc/cairn/cluster.yaml",
            }, targets  # fmt: skip


def test_a_trial_without_an_image_completes(lab: Lab, probe: Probe) -> None:
    """Released, the probe trial (no ``environment.image``) completes in its container and
    the experiment ends COMPLETED."""
    attrs = probe.container.attrs
    code, out = probe.container.exec_run(
        ["touch", "release"], user=attrs["Config"]["User"], workdir=probe.report["cwd"]
    )
    assert code == 0, out
    lab.cli("experiment", "wait", str(probe.experiment_id), timeout=600)
    described = lab.cli("experiment", "describe", str(probe.experiment_id))
    assert described["state"] == "COMPLETED", described
    lines = [e["line"] for e in lab.cli("trial", "logs", str(probe.trial_id))["logs"]]
    assert any("released" in line for line in lines), lines
