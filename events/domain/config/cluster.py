"""The cluster configuration: what an administrator allows user configs and accounts to do.

Experiment configs belong to users; this file belongs to whoever runs the cluster (in the
style of Determined's ``master.yaml``). It is YAML, read once per process by
:func:`load_cluster_config`: ``cairn up`` passes ``<data dir>/cluster.yaml`` (when it exists) to
every service, and a service started by hand takes ``--cluster-config PATH`` or
``CAIRN_CLUSTER_CONFIG``. Without a file every field has its default, which allows the least:
checkpoints only under the cluster's default checkpoint root, no S3 bucket that receives the
services' own credentials, no host path, device or added capability for a trial.

Every default of these settings lives here and nowhere else; ``docs/cluster-config.md``
documents each field.

Example::

    checkpoint_storage:
      allowed_roots: [/mnt/checkpoints]
      s3_server_credentials:
        - {bucket: team-ckpts, endpoint_url: "https://minio.internal:9000"}
    tasks:
      allowed_bind_mount_roots: [/datasets]
      allowed_devices: [/dev/fuse]
      allowed_capabilities: [SYS_PTRACE]
      default_image: {cpu: cairn-trial:local, cuda: cairn-trial-cuda:local}
    accounts:
      token_lifetime: 7d
      min_password_length: 12
    webhooks:
      allowed_urls: ["https://hooks.slack.com/services/", "https://*.example.com/hooks/"]
      allowed_networks: [10.20.0.0/16]
"""

from __future__ import annotations

import ipaddress
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer, ValidationError

from events.domain.config.common import ConfigModel
from events.domain.config.errors import ConfigError, from_validation_error, show
from events.domain.config.models import AbsPath
from events.domain.config.resource_pools import ResourcePool
from events.domain.config.safe_yaml import load_yaml
from events.domain.webhooks.urls import UrlError, parse_prefix

CLUSTER_CONFIG_FILE = "cluster.yaml"
"""The cluster config's file name in an embedded cluster's data directory."""

MAX_CLUSTER_CONFIG_BYTES = 1 << 20
"""The largest cluster config file read (a config is a few hundred bytes)."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$", re.ASCII)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _duration(value: Any) -> Any:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` or a number of seconds, as a ``timedelta``."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (found := _DURATION.match(value)):
        seconds = float(found.group(1)) * _UNIT_SECONDS[found.group(2)]
    else:
        raise ValueError(
            f"must be a duration such as '30d', '12h', '90m', '45s' or a number of seconds, "
            f"got {show(value)}"
        )
    if not 0 < seconds <= 100 * 365 * 86400:
        raise ValueError(f"must be more than 0 s and at most 100 years, got {show(value)}")
    return timedelta(seconds=seconds)


Duration = Annotated[
    timedelta,
    BeforeValidator(_duration),
    PlainSerializer(lambda d: d.total_seconds(), return_type=float),
]
"""A length of time, written ``30d``/``12h``/``90m``/``45s``/``2w`` or as seconds."""


class S3CredentialGrant(ConfigModel):
    """An S3 bucket that may be reached with the services' own credentials.

    Attributes:
        bucket: the bucket's name, or an ``fnmatch`` pattern (``team-*``; ``*`` for any).
        endpoint_url: the S3-compatible server, exactly as configs name it; ``None``: AWS
            (a config without ``endpoint_url``).
    """

    bucket: str = Field(min_length=1, max_length=255)
    endpoint_url: str | None = None


class CheckpointStoragePolicy(ConfigModel):
    """Where experiments may keep checkpoints (``checkpoint_storage`` of their configs).

    Attributes:
        allowed_roots: directories under which a ``shared_fs`` ``host_path`` (joined with its
            ``storage_path``) or a ``directory`` ``container_path`` may lie. The cluster's
            default checkpoint root is always allowed; with the default (none), checkpoints
            live only there.
        s3_server_credentials: the buckets (and endpoints) an ``s3`` storage may name without
            its own ``access_key``/``secret_key``, i.e. the ones the services' credentials are
            sent to. A config that brings its own keys may name any bucket.
    """

    allowed_roots: list[AbsPath] = Field(default_factory=list, max_length=1000)
    s3_server_credentials: list[S3CredentialGrant] = Field(default_factory=list, max_length=1000)


def _image_name(value: str) -> str:
    if not value or len(value) > 512 or any(c.isspace() for c in value):
        raise ValueError(
            f"must be an image name such as 'cairn-trial:local' (no spaces), got {show(value)}"
        )
    return value


ImageName = Annotated[str, AfterValidator(_image_name)]
"""A container image as ``docker run`` names it (``cairn-trial:local``, ``repo/name@sha256:...``)."""


def _images_of(value: Any) -> Any:
    """One image for every device (``cairn-trial:local``) as ``{cpu: ..., cuda: ...}``."""
    return {"cpu": value, "cuda": value} if isinstance(value, str) else value


class TaskImages(ConfigModel):
    """The image of each kind of slot, as Determined's default task images
    (``task_container_defaults.image``); a single name in the file means both.

    Attributes:
        cpu: the image of trials on CPU slots.
        cuda: the image of trials on GPUs (``gpu`` is not accepted here: write ``cuda``);
            ``None``: the ``cpu`` image.
    """

    cpu: ImageName
    cuda: ImageName | None = None

    def for_device(self, device: str) -> str:
        """The image for a run on ``device`` (``cpu`` or ``cuda``)."""
        return (self.cuda if device == "cuda" else None) or self.cpu


class TaskPolicy(ConfigModel):
    """What trial and task configs may ask of an agent's host (enforced by the agents and the
    API where they plan a trial's container or process), and how agents run user code.

    Attributes:
        allowed_bind_mount_roots: host directories under which ``bind_mounts[].host_path`` may
            lie; none (the default) allows no bind mount.
        allowed_devices: host device paths ``resources.devices[].host_path`` may name; none
            (the default) allows no device.
        allowed_capabilities: Linux capabilities (``SYS_PTRACE``, without ``CAP_``)
            ``environment.add_capabilities`` may name; none (the default) allows none.
        default_image: the image agents run a trial in when its config names none
            (``environment.image``); ``None`` (the default): such a trial runs as a process
            on the agent's machine.
    """

    allowed_bind_mount_roots: list[AbsPath] = Field(default_factory=list, max_length=1000)
    allowed_devices: list[AbsPath] = Field(default_factory=list, max_length=1000)
    allowed_capabilities: list[str] = Field(default_factory=list, max_length=100)
    default_image: Annotated[TaskImages, BeforeValidator(_images_of)] | None = None


class LoginThrottle(ConfigModel):
    """How many failed logins are tolerated before ``POST /auth/login`` answers 429.

    Failures are counted over the last ``window``, separately per username and per client
    address; a successful login clears the counts of its username and its address.

    Attributes:
        max_failures_per_user: failures for one username within ``window`` before it is
            throttled.
        max_failures_per_address: failures from one client address within ``window`` before it
            is throttled (whatever usernames it tries).
        window: how long a failure counts.
    """

    max_failures_per_user: int = Field(5, ge=1, le=1_000_000)
    max_failures_per_address: int = Field(20, ge=1, le=1_000_000)
    window: Duration = timedelta(minutes=5)


class AccountPolicy(ConfigModel):
    """User accounts and their tokens.

    Attributes:
        token_lifetime: how long a token from ``POST /auth/login`` is valid.
        min_password_length: the fewest characters a new password may have.
        login_throttle: limits on failed logins.
    """

    token_lifetime: Duration = timedelta(days=30)
    min_password_length: int = Field(8, ge=1, le=1000)
    login_throttle: LoginThrottle = Field(default_factory=LoginThrottle)


class UnmanagedPolicy(ConfigModel):
    """Unmanaged runs: scripts outside the cluster reporting through ``core_v2``.

    Attributes:
        heartbeat_timeout: how long an unmanaged run may go without a heartbeat (or any
            report) before it is ended as lost and its trial marked ERROR; its script sends
            one every third of this.
    """

    heartbeat_timeout: Duration = timedelta(minutes=5)


def _url_prefix(value: str) -> str:
    try:
        parse_prefix(value)
    except UrlError as exc:
        raise ValueError(str(exc)) from None
    return value


def _network(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError(
            f"must be an address or network such as '10.1.2.3' or '10.1.0.0/16', got {show(value)}"
        ) from None
    return value


UrlPrefixText = Annotated[str, AfterValidator(_url_prefix)]
"""An allowed webhook URL prefix (``https://hooks.slack.com/services/``, ``https://*.corp/``)."""
NetworkText = Annotated[str, AfterValidator(_network)]
"""An IP address or network in CIDR notation."""


class WebhookPolicy(ConfigModel):
    """Where webhooks may post, and how deliveries are retried (``docs/webhooks.md``).

    Attributes:
        allowed_urls: URL prefixes a webhook's URL must lie under (see
            :mod:`events.domain.webhooks.urls`); none (the default) allows no webhook.
        allowed_networks: networks outside the public internet (private, loopback,
            link-local, ...) that deliveries may connect to; none (the default) allows only
            public addresses. The cluster's own services are refused whatever this allows.
        timeout: how long one attempt waits for the receiver's answer.
        max_attempts: attempts per delivery before it is given up as failed.
        retry_delay: the wait before the second attempt; it doubles after each failure.
        max_retry_delay: the longest wait between two attempts.
        base_url: the web UI's address, for links in Slack messages (``None``: no links).
    """

    allowed_urls: list[UrlPrefixText] = Field(default_factory=list, max_length=1000)
    allowed_networks: list[NetworkText] = Field(default_factory=list, max_length=1000)
    timeout: Duration = timedelta(seconds=10)
    max_attempts: int = Field(5, ge=1, le=50)
    retry_delay: Duration = timedelta(seconds=1)
    max_retry_delay: Duration = timedelta(minutes=1)
    base_url: str | None = Field(None, max_length=2048)

    def networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """:attr:`allowed_networks` parsed."""
        return [ipaddress.ip_network(n, strict=False) for n in self.allowed_networks]

    def retry_after(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt (doubling, bounded)."""
        delay = self.retry_delay.total_seconds() * float(2 ** max(0, attempts - 1))
        return min(delay, self.max_retry_delay.total_seconds())


def _distinct_pools(pools: list[ResourcePool]) -> list[ResourcePool]:
    seen: set[str] = set()
    for pool in pools:
        if pool.pool_name in seen:
            raise ValueError(f"pool {pool.pool_name!r} is named twice")
        seen.add(pool.pool_name)
    return pools


class ClusterConfig(ConfigModel):
    """The whole cluster config (every section optional).

    Attributes:
        checkpoint_storage: where checkpoints may live.
        tasks: host paths, devices and capabilities trials may ask for.
        accounts: token lifetime, password length and login throttling.
        unmanaged: unmanaged runs' heartbeat timeout.
        webhooks: the URLs and networks webhooks may reach, and their retries.
        resource_pools: pools another resource manager (Slurm) owns the nodes of.
    """

    checkpoint_storage: CheckpointStoragePolicy = Field(default_factory=CheckpointStoragePolicy)
    tasks: TaskPolicy = Field(default_factory=TaskPolicy)
    accounts: AccountPolicy = Field(default_factory=AccountPolicy)
    unmanaged: UnmanagedPolicy = Field(default_factory=UnmanagedPolicy)
    webhooks: WebhookPolicy = Field(default_factory=WebhookPolicy)
    resource_pools: Annotated[list[ResourcePool], AfterValidator(_distinct_pools)] = Field(
        default_factory=list, max_length=100
    )

    def slurm_pools(self) -> dict[str, ResourcePool]:
        """The pools Slurm backs, by name."""
        return {p.pool_name: p for p in self.resource_pools if p.resource_manager == "slurm"}


class ClusterConfigError(ConfigError):
    """The cluster config file is unreadable or invalid (each error names the file and field)."""


def parse_cluster_config(
    raw: str | dict[str, Any] | None, source: str = CLUSTER_CONFIG_FILE
) -> ClusterConfig:
    """Validates a cluster config given as YAML text or data.

    Args:
        raw: the YAML text, the parsed mapping, or ``None``/empty text for all defaults.
        source: how errors name the document (the file's path).

    Returns:
        The frozen config, every default filled.

    Raises:
        ClusterConfigError: each problem with its dotted path (``accounts.token_lifetime``).
    """
    try:
        doc = load_yaml(raw, source=source) if isinstance(raw, str) else raw
    except ConfigError as exc:
        raise ClusterConfigError(exc.errors) from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ClusterConfigError([(source, f"must be a mapping, got {show(doc)}")])
    try:
        return ClusterConfig.model_validate(doc)
    except ValidationError as exc:
        errors = from_validation_error(exc, doc, _VOCABULARY).errors
        raise ClusterConfigError([(f"{source}: {p}", m) for p, m in errors]) from None


def load_cluster_config(path: Path | str | None) -> ClusterConfig:
    """Reads the cluster config file at ``path`` (``None``: all defaults).

    Call it once when a process starts and hand the result to what needs it.

    Raises:
        ClusterConfigError: the file cannot be read or is invalid.
    """
    if path is None or str(path) == "":
        return ClusterConfig()
    file = Path(path)
    try:
        with file.open("rb") as fh:
            data = fh.read(MAX_CLUSTER_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ClusterConfigError([(str(file), f"cannot read: {exc.strerror or exc}")]) from None
    if len(data) > MAX_CLUSTER_CONFIG_BYTES:
        raise ClusterConfigError([(str(file), f"larger than {MAX_CLUSTER_CONFIG_BYTES} bytes")])
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise ClusterConfigError([(str(file), "is not UTF-8 text")]) from None
    return parse_cluster_config(text, source=str(file))


def _vocabulary() -> frozenset[str]:
    names: set[str] = set()
    for model in (
        ClusterConfig,
        CheckpointStoragePolicy,
        S3CredentialGrant,
        TaskPolicy,
        TaskImages,
        AccountPolicy,
        LoginThrottle,
        WebhookPolicy,
    ):
        names.update(model.model_fields)
    return frozenset(names)


_VOCABULARY = _vocabulary()
