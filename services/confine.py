"""Confinement of user code: the unix identity it runs as, what it can see and what it can do.

Every launcher of user code (trial processes, trial containers, custom searchers) goes through
this module; none starts user code with the services' own uid when this machine allows another.

The rules it keeps:

- **Never the services' uid.** When the launcher runs as root, user code runs as an
  unprivileged :class:`Identity` through ``setpriv``: real, effective and saved uid and gid
  changed, supplementary groups cleared, no new privileges (setuid binaries and file
  capabilities grant nothing), no capabilities (inheritable, ambient and bounding sets empty).
  uid and gid 0 are refused. A process of another uid cannot read the services' environments
  (``/proc/<pid>/environ`` needs ptrace access), cannot signal them, and reads only the files
  its identity may read.
- **A view of the filesystem of its own.** Where a mount namespace can be made, the command
  runs in one (``unshare --mount``), in which the paths a caller hides (the data directory, the
  agent's work directory) are covered by an empty tmpfs, the directories user code needs (its
  work directory, checkpoint storage, the Python interpreter and ``cairn``) stay reachable at
  their own paths even under a cover or under an ancestor its identity cannot traverse (a
  ``/root`` of mode 0700), and ``/proc`` shows only its own identity's processes
  (``hidepid=invisible``). Where none can be made (a container without ``CAP_SYS_ADMIN``),
  file permissions alone keep the boundary.
- **Optionally no network:** ``network=False`` runs it in a new network namespace, whose only
  interface (loopback) is down.
- **The pid is the user program's.** ``unshare``, the view builder
  (:mod:`services.confine_view`) and ``setpriv`` each exec the next, never fork, so the pid a
  launcher gets from starting the command line is the user program's own: process-group
  signals, preemption (SIGTERM) and left-over tracking (pid and start time) keep working.
- **Without root** (a developer's ``cairn up``), no uid can be changed: user code runs as the
  launcher's uid, in a user and mount namespace when the kernel allows unprivileged ones, so
  the hidden paths (the data directory's secret files) stay hidden and cannot be unmounted. It
  can still signal processes of that uid; the services' environments are protected only by their
  being non-dumpable. A container engine socket the launcher may write (through its groups) is
  covered too, and without a user namespace to cover it user code is refused: it would be root
  on the host. ``docs/security.md`` states these limits.
- **No engine socket in sight.** A root launcher covers every container engine socket it
  finds (:data:`events.domain.config.host_requests.ENGINE_SOCKETS`) in user code's view; where it
  cannot make a mount namespace (an agent in a container that holds the socket to start trial
  containers), user code is refused as a process: it must run in a container of its own.

Nothing here runs at import time; the machine is probed once, on first use.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from events.domain.config.host_requests import ENGINE_SOCKETS
from events.domain.identities import CLUSTER_UID, UnixIdentity

log = structlog.get_logger("confine")

MAX_ID = 2**32 - 2
"""The largest uid or gid (``2**32 - 1`` is the kernel's "no id")."""
USER_CODE_UMASK = 0o077
"""What user code creates is readable by its own identity only (and by root)."""
SHARED_DIR_MODE = 0o1733
"""A directory that the code of several identities creates entries in (checkpoint storage the
agent created): anyone may create, nobody but root may list, only an entry's owner may remove it."""


class ConfinementError(Exception):
    """User code cannot be confined as asked on this machine (the message says what is
    missing); nothing was started."""


@dataclass(frozen=True)
class Identity:
    """The unix identity user code runs as.

    Attributes:
        uid: the user id (never 0).
        gid: the primary group id (never 0); supplementary groups are always cleared.
        user: the name libraries read from ``USER``/``LOGNAME`` (``getpass.getuser()``): a
            linked account's name, or the cairn user's; ``cairn`` when empty.
    """

    uid: int
    gid: int
    user: str = ""

    def __post_init__(self) -> None:
        for name in ("uid", "gid"):
            value = getattr(self, name)
            if value == 0 and not isinstance(value, bool):
                raise ConfinementError(f"{name} 0: user code never runs as root")
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_ID:
                raise ConfinementError(f"{name} {value!r}: must be an integer from 1 to {MAX_ID}")

    @property
    def name(self) -> str:
        """``user``, or ``cairn`` when it is empty."""
        return self.user or "cairn"


@dataclass(frozen=True)
class View:
    """What of the filesystem user code sees (in a mount namespace where one can be made).

    Attributes:
        hide: directories (or files) covered by an empty tmpfs (or ``/dev/null``).
        expose: directories that stay reachable at their own paths, under a cover or under an
            ancestor the identity cannot traverse (permissions inside them still apply).
        runtime: also expose the Python interpreter, its packages and ``cairn`` itself.
        proc: mount a ``/proc`` that shows only the identity's own processes (with root only).
        umask: the umask user code starts with.
    """

    hide: tuple[Path, ...] = ()
    expose: tuple[Path, ...] = ()
    runtime: bool = True
    proc: bool = True
    umask: int = USER_CODE_UMASK


@dataclass(frozen=True)
class Host:
    """What this machine allows (probed once by :func:`host`)."""

    root: bool
    setpriv: str | None
    unshare: str | None
    mount_ns: bool
    net_ns: bool
    user_ns: bool = False
    reasons: dict[str, str] = field(default_factory=dict)


def _probe(command: list[str]) -> str | None:
    """``None`` when ``command`` succeeds, else why not."""
    try:
        done = subprocess.run(command, check=False, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    return done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}"


@functools.cache
def host() -> Host:
    """What confinement this machine allows, probed on first use and remembered.

    As root: ``setpriv`` and ``unshare`` present, and whether mount and network namespaces can
    be made. Without root: whether an unprivileged user namespace (with mount and network
    namespaces) can be made.
    """
    root = os.geteuid() == 0
    setpriv = shutil.which("setpriv")
    unshare = shutil.which("unshare")
    reasons: dict[str, str] = {}
    mount_ns = net_ns = user_ns = False
    if unshare is not None:
        true = shutil.which("true") or "/bin/true"
        user = [] if root else ["--user", "--map-root-user"]
        why = _probe([unshare, *user, "--mount", "--propagation", "private", true])
        mount_ns = why is None
        if why is not None:
            reasons["mount_ns"] = why
        why = _probe([unshare, *user, "--net", true])
        net_ns = why is None
        if why is not None:
            reasons["net_ns"] = why
        user_ns = not root and mount_ns
    else:
        reasons["unshare"] = "util-linux unshare is not installed"
    if setpriv is None:
        reasons["setpriv"] = "util-linux setpriv is not installed"
    found = Host(root, setpriv, unshare, mount_ns, net_ns, user_ns, reasons)
    log.info(
        "user code confinement",
        root=root,
        setpriv=setpriv is not None,
        mount_namespace=mount_ns,
        network_namespace=net_ns,
        user_namespace=user_ns,
        reasons=reasons or None,
    )
    return found


def default_identity(*, uid: int = CLUSTER_UID) -> Identity | None:
    """The cluster's unprivileged identity, for user code that belongs to no particular user
    (each user's own comes from :mod:`events.domain.identities`).

    Args:
        uid: its uid and gid (:data:`events.domain.identities.CLUSTER_UID` unless the cluster chose
            another).

    Returns:
        ``Identity(uid, uid, "cairn")`` where the launcher can change uids (runs as root with
        ``setpriv`` installed); ``None`` where it cannot (user code then runs as the launcher's
        own uid: see the module's notes on the mode without root).
    """
    found = host()
    if not found.root or found.setpriv is None:
        return None
    return Identity(uid, uid, "cairn")


def identity_of(decided: UnixIdentity) -> Identity:
    """The :class:`Identity` of a user's identity as the log decided it
    (:func:`events.domain.identities.fold_identities`).

    Raises:
        ConfinementError: it names uid or gid 0.
    """
    return Identity(decided.uid, decided.gid, decided.user)


def can_change_identity() -> bool:
    """Whether user code can run under another uid here (root, with ``setpriv``)."""
    found = host()
    return found.root and found.setpriv is not None


def runtime_paths() -> list[Path]:
    """What any Python user code needs to read: the interpreter's prefixes, the package
    directories on this process's ``sys.path`` and the directory holding ``cairn`` (real paths).

    Other ``sys.path`` entries (the directory a service was started in) are left out: they are
    the launcher's, not the runtime's.
    """
    prefixes = {Path(os.path.realpath(p)) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    paths = set(prefixes)
    paths.add(Path(os.path.realpath(sys.executable)).parent)
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        real = Path(os.path.realpath(entry))
        if real.name in ("site-packages", "dist-packages") or any(
            real == p or p in real.parents for p in prefixes
        ):
            paths.add(real)
    spec = importlib.util.find_spec("cairn")
    if spec is not None and spec.submodule_search_locations:
        package = Path(os.path.realpath(next(iter(spec.submodule_search_locations))))
        paths.add(package.parent)
    return sorted(paths)


def _searchable(info: os.stat_result, identity: Identity) -> bool:
    mode = info.st_mode
    if info.st_uid == identity.uid:
        return bool(mode & stat.S_IXUSR)
    if info.st_gid == identity.gid:
        return bool(mode & stat.S_IXGRP)
    return bool(mode & stat.S_IXOTH)


def blocking_ancestors(path: Path, identity: Identity) -> list[Path]:
    """The directories above ``path`` (``path`` excluded), highest first, that ``identity``
    cannot traverse, judged by the mode bits (ACLs are not read); empty when it can reach
    ``path``."""
    path = Path(os.path.abspath(path))
    found = []
    for ancestor in reversed(path.parents):
        try:
            info = os.stat(ancestor)
        except OSError:
            break
        if not _searchable(info, identity):
            found.append(ancestor)
    return found


def searchable(path: Path, identity: Identity) -> bool:
    """Whether ``identity`` may traverse directory ``path`` itself (mode bits)."""
    try:
        return _searchable(os.stat(path), identity)
    except OSError:
        return False


def _normal(paths: Iterable[Path]) -> list[str]:
    return sorted({os.path.abspath(p) for p in paths})


def view_plan(view: View, identity: Identity | None) -> dict[str, object]:
    """The plan :mod:`services.confine_view` builds for ``view`` (see its docstring).

    Every ancestor of an exposed directory that ``identity`` cannot traverse is covered too
    (the exposed directory is bound back into the cover), and an exposed directory the identity
    cannot enter itself is left out.
    """
    exposes = list(view.expose) + (runtime_paths() if view.runtime else [])
    covers = list(view.hide)
    if identity is not None:
        # A directory the identity cannot enter is no use exposed, and exposed it would stand
        # between the identity and what lies below it.
        exposes = [p for p in exposes if searchable(p, identity)]
        for path in exposes:
            covers.extend(blocking_ancestors(path, identity))
    return {"covers": _normal(covers), "exposes": _normal(exposes), "umask": view.umask}


def reachable_engine_sockets() -> list[Path]:
    """The container engine sockets this process may write to (through its uid or groups):
    user code that kept this process's uid and groups could drive the engine."""
    found = []
    for name in ENGINE_SOCKETS:
        path = Path(name)
        with contextlib.suppress(OSError):
            if path.exists() and os.access(path, os.W_OK):
                found.append(path)
    return found


def _setpriv(setpriv: str, identity: Identity) -> list[str]:
    return [
        setpriv,
        f"--reuid={identity.uid}",
        f"--regid={identity.gid}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--bounding-set=-all",
        "--",
    ]


def _view_builder(plan: Mapping[str, object]) -> list[str]:
    script = Path(__file__).with_name("confine_view.py")
    return [sys.executable, "-I", "-S", str(script), json.dumps(plan, sort_keys=True), "--"]


def confined_argv(
    argv: Sequence[str],
    *,
    identity: Identity | None,
    network: bool = True,
    view: View | None = None,
) -> list[str]:
    """The command line that runs ``argv`` confined (see the module docstring).

    Start it with ``start_new_session=True`` as usual: the started pid is ``argv``'s program.

    Args:
        argv: the user program and its arguments.
        identity: who it runs as; ``None`` keeps the launcher's uid (only where
            :func:`default_identity` is ``None``, or for a launcher that is not root).
        network: ``False`` runs it in a new network namespace with no usable interface.
        view: what of the filesystem it sees (default: a ``/proc`` of its own, the runtime
            reachable, nothing else hidden).

    Returns:
        The command line to execute.

    Raises:
        ConfinementError: this machine cannot do what was asked (an identity without root or
            ``setpriv``; no network namespace for ``network=False``), or ``argv`` is empty.
    """
    if not argv:
        raise ConfinementError("no command to confine")
    view = view or View()
    found = host()
    if identity is not None and not found.root:
        raise ConfinementError(
            f"user code cannot run as uid {identity.uid}: the launcher is not root"
        )
    if identity is not None and found.setpriv is None:
        raise ConfinementError(
            f"user code cannot run as uid {identity.uid}: {found.reasons['setpriv']}"
        )
    if not network and not found.net_ns:
        why = found.reasons.get("net_ns") or found.reasons.get("unshare", "")
        raise ConfinementError(f"user code cannot be cut off the network here: {why}")
    program = list(argv)
    if found.root:
        drop = _setpriv(found.setpriv, identity) if identity and found.setpriv else []
        sockets = reachable_engine_sockets()
        if sockets and not found.mount_ns:
            raise ConfinementError(
                f"user code would reach the container engine's socket {sockets[0]}: this "
                "launcher holds it and cannot hide it without a mount namespace; run user "
                "code in containers (the cluster config's tasks.default_image) or start the "
                "launcher where it has no engine socket"
            )
        view = replace(view, hide=(*view.hide, *sockets))
        if not found.mount_ns:
            if view.hide:
                log.warning(
                    "no mount namespace: hidden paths are protected by their permissions only",
                    reason=found.reasons.get("mount_ns"),
                )
            flags = [] if network else ["--net"]
            builder = _view_builder({"umask": view.umask})
            prefix = [found.unshare or "unshare", *flags, "--"] if flags else []
            return [*prefix, *builder, *drop, *program]
        plan = view_plan(view, identity)
        plan["proc"] = view.proc
        flags = ["--mount", "--propagation", "private", *([] if network else ["--net"])]
        assert found.unshare is not None
        return [found.unshare, *flags, "--", *_view_builder(plan), *drop, *program]
    sockets = reachable_engine_sockets()
    if not found.user_ns:
        if sockets:
            raise ConfinementError(
                f"user code would reach the container engine's socket {sockets[0]} through "
                "this launcher's groups and would be root on the host: run the launcher as "
                "root (user code then runs as another uid, without those groups) or take it "
                "out of the socket's group"
            )
        if view.hide:
            log.warning(
                "no user namespace: hidden paths are protected by their permissions only",
                reason=found.reasons.get("mount_ns"),
            )
        return program
    view = replace(view, hide=(*view.hide, *sockets))
    plan = view_plan(view, None)
    plan["nest"] = [os.getuid(), os.getgid()]
    flags = ["--user", "--map-root-user", "--mount", "--propagation", "private"]
    flags += [] if network else ["--net"]
    assert found.unshare is not None
    return [found.unshare, *flags, "--", *_view_builder(plan), *program]


def confined_environment(
    identity: Identity | None, *, home: Path, tmp: Path | None = None
) -> dict[str, str]:
    """The variables user code needs to find itself without a passwd entry for its uid:
    ``HOME``, ``USER``, ``LOGNAME`` (``getpass.getuser()``, caches under ``~``) and, when
    given, ``TMPDIR`` (a temporary directory of its own, so no library shares one in ``/tmp``
    with other identities).

    Args:
        identity: who the code runs as (``None``: the launcher's own user).
        home: its home directory.
        tmp: its temporary directory.
    """
    if identity is not None:
        user = identity.name
    else:
        user = os.environ.get("USER") or os.environ.get("LOGNAME") or "cairn"
    env = {"HOME": str(home), "USER": user, "LOGNAME": user}
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    return env


def chown_tree(root: Path, identity: Identity) -> None:
    """Makes ``identity`` the owner of ``root`` and everything under it (symbolic links
    themselves, never what they point to)."""
    os.lchown(root, identity.uid, identity.gid)
    for parent, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(parent, name), identity.uid, identity.gid)


def may_write(path: Path, identity: Identity) -> bool:
    """Whether ``identity`` may create entries in directory ``path`` (mode bits)."""
    info = os.stat(path)
    if info.st_uid == identity.uid:
        return bool(info.st_mode & stat.S_IWUSR and info.st_mode & stat.S_IXUSR)
    if info.st_gid == identity.gid:
        return bool(info.st_mode & stat.S_IWGRP and info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IWOTH and info.st_mode & stat.S_IXOTH)
