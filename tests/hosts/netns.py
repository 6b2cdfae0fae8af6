"""Hosts made of Linux network namespaces on one bridge: the many-hosts test bed's network.

Each :class:`Host` is a network namespace (``cairnh-<name>``) with one veth whose other end is
a port of the bridge :data:`BRIDGE` in the root namespace, and its own address in
:data:`SUBNET`; the root namespace (where the tests run, an operator's workstation) has
:data:`WORKSTATION` on the bridge. Processes are started in a host by forking from a thread
that entered its namespace (:func:`call_in`), so every connection between two hosts crosses
two veths and the bridge; nothing but a host's own processes sees its loopback.

Docker's ``FORWARD`` policy (``DROP``) also applies to bridged frames here
(``br_netfilter``), so :meth:`Network.up` inserts one ``ACCEPT`` rule for the bridge, tagged
with :data:`TAG`, and :meth:`Network.down` deletes it with the namespaces and the bridge. A
run killed before its teardown leaves them behind; the next :meth:`Network.up` removes them
first (:func:`sweep`).

``python -m tests.hosts.netns`` exits 0 when namespaces can be made here, else 1 with the
reason (``.ci/run`` asks it before ``make test-hosts``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

BRIDGE = "cairnbr0"
SUBNET = "10.77.0.0/24"
WORKSTATION = "10.77.0.254"
"""The root namespace's address on the bridge (the tests' own connections come from it)."""
NETNS_PREFIX = "cairnh-"
LINK_PREFIX = "cairnv"
"""The root namespace's ends of the hosts' veths (``cairnv1``, ``cairnv2``, ...)."""
TAG = "cairn-hosts"
"""The comment on every iptables rule the test bed adds."""
CLONE_NEWNET = 0x40000000
T = TypeVar("T")


class NamespaceError(RuntimeError):
    """A namespace, link or rule could not be made (the command and its error)."""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs ``argv``; raises :class:`NamespaceError` with its stderr when it fails and
    ``check``."""
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NamespaceError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (``None``: they can)."""
    if os.geteuid() != 0:
        return "the hosts test bed makes network namespaces and needs root"
    probe = f"{NETNS_PREFIX}probe"
    try:
        sh("ip", "netns", "add", probe)
        sh("ip", "netns", "exec", probe, "iptables", "-S")
    except (NamespaceError, FileNotFoundError) as exc:
        return f"network namespaces or iptables are unavailable here: {exc}"
    finally:
        sh("ip", "netns", "delete", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    """One host: a network namespace with an address on the bridge.

    Attributes:
        name: the test bed's name for it (``control``, ``agent-1``).
        index: its number (its address's last byte, its veth's suffix).
    """

    name: str
    index: int

    @property
    def netns(self) -> str:
        """The namespace's name (``ip netns``)."""
        return f"{NETNS_PREFIX}{self.name}"

    @property
    def address(self) -> str:
        """Its address on the bridge."""
        return f"10.77.0.{self.index}"

    @property
    def link(self) -> str:
        """The root namespace's end of its veth (a bridge port); setting it down cuts the
        host off."""
        return f"{LINK_PREFIX}{self.index}"


def _enter(netns: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/var/run/netns/{netns}", "rb") as handle:
        if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise NamespaceError(f"setns into {netns}: {os.strerror(errno)}")


def call_in(netns: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` run in a thread of its own that entered ``netns``: the sockets
    it opens and the processes it starts (with their children) live in that host.

    A network namespace belongs to a thread, so the caller's own stays as it was.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            _enter(netns)
            result.append(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name=f"in-{netns}")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def namespace_pids(netns: str) -> list[int]:
    """The processes living in ``netns``."""
    out = sh("ip", "netns", "pids", netns, check=False).stdout
    return [int(pid) for pid in out.split()]


def listening(pid: int) -> set[tuple[str, int]]:
    """The IPv4 ``(address, port)`` pairs listened on in the network namespace of process
    ``pid`` (its ``/proc/PID/net/tcp``; psutil reads the caller's own namespace's table)."""
    found = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] != "0A":  # TCP_LISTEN
            continue
        address, port = fields[1].split(":")
        packed = int(address, 16).to_bytes(4, "little")
        found.add((str(ipaddress.IPv4Address(packed)), int(port, 16)))
    return found


def _forward_rule(action: str) -> tuple[str, ...]:
    return ("iptables", action, "FORWARD", "-i", BRIDGE, "-o", BRIDGE,
            "-m", "comment", "--comment", TAG, "-j", "ACCEPT")  # fmt: skip


def sweep() -> None:
    """Removes whatever an earlier run of the test bed left: its namespaces (SIGKILLing the
    processes in them), its bridge and its iptables rule."""
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(NETNS_PREFIX):
            for pid in namespace_pids(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            sh("ip", "netns", "delete", name, check=False)
    # A deleted namespace lives on until the kernel has reaped its last process, and its veths
    # with it: removing the root end now frees the name for the next bed at once.
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        fields = line.split(": ")
        link = fields[1].split("@")[0] if len(fields) > 1 else ""
        if link.startswith(LINK_PREFIX):
            sh("ip", "link", "delete", link, check=False)
    sh("ip", "link", "delete", BRIDGE, check=False)
    while sh(*_forward_rule("-D"), check=False).returncode == 0:
        pass


class Network:
    """The bridge and one namespace per host; :meth:`up` makes them, :meth:`down` removes them
    and every process left in them.

    Args:
        names: the hosts, the first one ``10.77.0.1``, the next ``.2`` and so on.
    """

    def __init__(self, names: list[str]) -> None:
        self.hosts = {name: Host(name, i + 1) for i, name in enumerate(names)}

    def up(self) -> None:
        """Makes the bridge, the namespaces and their links (after :func:`sweep`).

        Raises:
            NamespaceError: a command failed (its stderr says why).
        """
        sweep()
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{WORKSTATION}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        sh(*_forward_rule("-I"))
        for host in self.hosts.values():
            sh("ip", "netns", "add", host.netns)
            sh("ip", "link", "add", host.link, "type", "veth", "peer", "name", "eth0",
               "netns", host.netns)  # fmt: skip
            sh("ip", "link", "set", host.link, "master", BRIDGE)
            sh("ip", "link", "set", host.link, "up")
            inside = ("ip", "netns", "exec", host.netns)
            sh(*inside, "ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
            sh(*inside, "ip", "link", "set", "eth0", "up")
            sh(*inside, "ip", "link", "set", "lo", "up")

    def down(self) -> None:
        """SIGKILLs every process left in the hosts and removes the namespaces, the links, the
        bridge and the rule (also after a failed :meth:`up`)."""
        sweep()

    def cut(self, name: str) -> None:
        """Cuts host ``name`` off the bridge (its link down): its processes keep running and
        reach nothing but themselves."""
        sh("ip", "link", "set", self.hosts[name].link, "down")

    def restore(self, name: str) -> None:
        """Puts host ``name`` back on the bridge."""
        sh("ip", "link", "set", self.hosts[name].link, "up")

    def drop_at_random(self, name: str, probability: float) -> None:
        """Drops each packet into and out of host ``name`` with ``probability`` (iptables'
        ``statistic`` match in its namespace; this kernel has no ``netem``)."""
        for chain in ("INPUT", "OUTPUT"):
            sh("ip", "netns", "exec", self.hosts[name].netns, "iptables", "-A", chain,
               "-i" if chain == "INPUT" else "-o", "eth0",
               "-m", "statistic", "--mode", "random", "--probability", str(probability),
               "-m", "comment", "--comment", TAG, "-j", "DROP")  # fmt: skip

    def _reject_rule(
        self, action: str, name: str, address: str, port: int, *, silent: bool
    ) -> tuple[str, ...]:
        verdict = ("DROP",) if silent else ("REJECT", "--reject-with", "tcp-reset")
        return ("ip", "netns", "exec", self.hosts[name].netns, "iptables", action, "OUTPUT",
                "-d", address, "-p", "tcp", "--dport", str(port), "-m", "comment",
                "--comment", TAG, "-j", *verdict)  # fmt: skip

    def partition(self, name: str, address: str, port: int, *, silent: bool = False) -> None:
        """Host ``name`` can no longer reach ``address:port``, everything else it reaches as
        before: its connections there are reset (``ss -K``) and new ones refused, or, when
        ``silent``, every packet it sends there is dropped (no reset, no refusal: only the
        client's own timeouts and pings can tell)."""
        sh(*self._reject_rule("-I", name, address, port, silent=silent))
        if not silent:
            sh("ip", "netns", "exec", self.hosts[name].netns,
               "ss", "-K", "dst", address, "dport", "=", str(port))  # fmt: skip

    def heal(self, name: str, address: str, port: int, *, silent: bool = False) -> None:
        """Undoes :meth:`partition` (with the same ``silent``)."""
        sh(*self._reject_rule("-D", name, address, port, silent=silent))

    def silenced(self, name: str) -> int:
        """Packets host ``name``'s silent partitions dropped so far."""
        out = sh("ip", "netns", "exec", self.hosts[name].netns,
                 "iptables", "-L", "OUTPUT", "-v", "-x", "-n").stdout  # fmt: skip
        return sum(
            int(line.split()[0])
            for line in out.splitlines()
            if "DROP" in line and "statistic" not in line and "dpt:" in line
        )

    def dropped(self, name: str) -> int:
        """Packets host ``name``'s random-drop rules dropped so far."""
        out = sh("ip", "netns", "exec", self.hosts[name].netns,
                 "iptables", "-L", "-v", "-x", "-n").stdout  # fmt: skip
        return sum(
            int(line.split()[0])
            for line in out.splitlines()
            if "statistic" in line and "DROP" in line
        )


if __name__ == "__main__":
    reason = unavailable()
    if reason is not None:
        print(reason, file=sys.stderr)
        sys.exit(1)
