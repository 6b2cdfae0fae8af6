"""The cluster config file: its defaults allow the least, and a bad file names file and field."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from cairn.local.layout import cluster_config_path
from cairn.local.options import ClusterOptions
from cairn.local.supervisor import ClusterStartError, Supervisor
from events.domain.config.cluster import (
    ClusterConfig,
    ClusterConfigError,
    load_cluster_config,
    parse_cluster_config,
)


def test_defaults_allow_nothing_beyond_the_default_root() -> None:
    """Without a file: no extra roots, no S3 grant, no host path, device or capability."""
    config = load_cluster_config(None)
    assert config == ClusterConfig()
    assert config.checkpoint_storage.allowed_roots == []
    assert config.checkpoint_storage.s3_server_credentials == []
    assert config.tasks.allowed_bind_mount_roots == []
    assert config.tasks.allowed_devices == []
    assert config.tasks.allowed_capabilities == []
    assert config.tasks.default_image is None
    assert config.accounts.token_lifetime == timedelta(days=30)
    assert config.accounts.min_password_length == 8


def test_a_full_file_is_read(tmp_path: Path) -> None:
    """Every section of a written file is read, durations in their short forms."""
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "checkpoint_storage:\n"
        "  allowed_roots: [/mnt/ckpt]\n"
        "  s3_server_credentials: [{bucket: 'team-*', endpoint_url: 'http://minio:9000'}]\n"
        "tasks: {allowed_bind_mount_roots: [/data], allowed_devices: [/dev/fuse],"
        " allowed_capabilities: [SYS_PTRACE]}\n"
        "accounts:\n"
        "  token_lifetime: 12h\n"
        "  min_password_length: 12\n"
        "  login_throttle: {max_failures_per_user: 3, window: 90}\n"
    )
    config = load_cluster_config(path)
    assert config.checkpoint_storage.allowed_roots == ["/mnt/ckpt"]
    grant = config.checkpoint_storage.s3_server_credentials[0]
    assert (grant.bucket, grant.endpoint_url) == ("team-*", "http://minio:9000")
    assert config.tasks.allowed_devices == ["/dev/fuse"]
    assert config.accounts.token_lifetime == timedelta(hours=12)
    assert config.accounts.login_throttle.max_failures_per_user == 3
    assert config.accounts.login_throttle.max_failures_per_address == 20
    assert config.accounts.login_throttle.window == timedelta(seconds=90)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("accounts: {token_lifetim: 7d}", "accounts.token_lifetim: unknown field (did you mean"),
        ("accounts: {token_lifetime: 7y}", "accounts.token_lifetime: must be a duration"),
        ("accounts: {token_lifetime: 0}", "accounts.token_lifetime: must be more than 0 s"),
        ("accounts: {min_password_length: 0}", "accounts.min_password_length: must be >= 1"),
        ("checkpoint_storage: {allowed_roots: [rel]}", "allowed_roots[0]: must be an absolute"),
        ("tasks: {default_image: 'a b'}", "tasks.default_image: must be an image name"),
        ("tasks: {default_image: {gpu: x}}", "tasks.default_image.gpu: unknown field"),
        ("[1, 2]", "must be a mapping"),
        ("a: [", "invalid YAML"),
    ],
)
def test_a_bad_file_names_the_file_and_the_field(tmp_path: Path, text: str, expected: str) -> None:
    """Each invalid cluster config is refused with the file's path and the field."""
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    with pytest.raises(ClusterConfigError) as caught:
        load_cluster_config(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert expected in str(caught.value)


def test_the_default_image_is_one_name_or_one_per_device() -> None:
    """``tasks.default_image`` as one name serves every device; as a mapping, ``cuda`` falls
    back to ``cpu``."""
    one = parse_cluster_config("tasks: {default_image: cairn-trial:local}").tasks.default_image
    assert one is not None
    assert one.for_device("cpu") == one.for_device("cuda") == "cairn-trial:local"
    both = parse_cluster_config("tasks: {default_image: {cpu: c, cuda: g}}").tasks.default_image
    assert both is not None and (both.for_device("cpu"), both.for_device("cuda")) == ("c", "g")
    cpu = parse_cluster_config("tasks: {default_image: {cpu: c}}").tasks.default_image
    assert cpu is not None and cpu.for_device("cuda") == "c"


def test_a_missing_file_is_an_error_not_the_defaults(tmp_path: Path) -> None:
    """A named file that cannot be read is refused (a typo never silently means "defaults")."""
    with pytest.raises(ClusterConfigError, match="cannot read"):
        load_cluster_config(tmp_path / "nope.yaml")


def test_an_empty_file_is_all_defaults() -> None:
    """An empty document (or only comments) is every default."""
    assert parse_cluster_config("# nothing yet\n") == ClusterConfig()


def test_cairn_up_refuses_an_invalid_cluster_config_before_starting_anything(
    tmp_path: Path,
) -> None:
    """An invalid ``DIR/cluster.yaml`` stops ``cairn up`` with the file and field named, before
    PostgreSQL or any service starts; the state file says why."""
    (tmp_path / "cluster.yaml").write_text("accounts: {token_lifetime: soon}\n")
    supervisor = Supervisor(ClusterOptions(data_dir=tmp_path))
    with pytest.raises(ClusterStartError) as caught:
        supervisor.start()
    assert f"{tmp_path / 'cluster.yaml'}: accounts.token_lifetime" in str(caught.value)
    assert not (tmp_path / "pg").exists()
    assert supervisor.state.status == "failed"
    assert cluster_config_path(tmp_path) == tmp_path / "cluster.yaml"
