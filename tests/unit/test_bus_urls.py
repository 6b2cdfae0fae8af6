"""A NATS URL names one server or a cluster's servers (comma-separated) and one credentials file."""

from __future__ import annotations

from pathlib import Path

import pytest

from events import settings
from events.log.bus import (
    MAX_OUTSTANDING_PINGS,
    PING_INTERVAL_SECONDS,
    BusUrlError,
    connect_options,
    default_replicas,
    server_urls,
    split_url,
    with_creds,
)

CLUSTER = "nats://a:4222,nats://b:4222,nats://c:4222"


def test_a_cluster_url_names_every_server_in_order() -> None:
    """Each comma-separated server is one entry of the client's server list, blanks ignored."""
    assert server_urls(" nats://a:4222 , nats://b:4222,,nats://c:4222 ") == [
        "nats://a:4222",
        "nats://b:4222",
        "nats://c:4222",
    ]
    assert connect_options(CLUSTER)["servers"] == server_urls(CLUSTER)


def test_credentials_are_named_once_after_the_last_server() -> None:
    """``with_creds`` names the file once; ``split_url`` and ``connect_options`` read it back
    wherever it is named, and a second different file is refused with both paths named."""
    url = with_creds(CLUSTER, "/run/relay.creds")
    assert url == f"{CLUSTER}?creds=/run/relay.creds"
    assert split_url(url) == (CLUSTER, Path("/run/relay.creds"))
    assert with_creds(url, "/run/api.creds") == f"{CLUSTER}?creds=/run/api.creds"
    first = "nats://a:4222?creds=/x.creds,nats://b:4222"
    assert connect_options(first) == {
        "servers": ["nats://a:4222", "nats://b:4222"],
        "user_credentials": "/x.creds",
        "ping_interval": PING_INTERVAL_SECONDS,
        "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
    }
    with pytest.raises(BusUrlError, match=r"/x.creds and /y.creds"):
        split_url("nats://a:4222?creds=/x.creds,nats://b:4222?creds=/y.creds")


def test_a_url_without_a_server_is_refused() -> None:
    """An empty or comma-only URL is an error that quotes it, not a client with no servers."""
    with pytest.raises(BusUrlError, match="names no server"):
        server_urls(" , ")


def test_replicas_default_to_the_servers_named_at_most_three() -> None:
    """One copy on a lone server, three on a cluster of three or more."""
    assert default_replicas("nats://a:4222?creds=/x") == 1
    assert default_replicas(CLUSTER) == 3
    assert default_replicas(f"{CLUSTER},nats://d:4222,nats://e:4222") == 3


def test_the_replica_setting_takes_one_to_five() -> None:
    """``CAIRN_NATS_REPLICAS`` outside 1-5 is an error naming the variable and the value."""
    assert settings.NATS_REPLICAS.get({}) is None
    assert settings.NATS_REPLICAS.get({"CAIRN_NATS_REPLICAS": "3"}) == 3
    with pytest.raises(settings.SettingError, match=r"CAIRN_NATS_REPLICAS.*7"):
        settings.NATS_REPLICAS.get({"CAIRN_NATS_REPLICAS": "7"})
