"""Webhooks' pure rules: allowed URL prefixes and refused addresses, the decider, which
webhooks a happening fires, the payload shapes and the signature."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime

import pytest

from events.domain.aggregates.teams import Teams
from events.domain.aggregates.webhooks import Webhook, Webhooks
from events.domain.config import parse_config
from events.domain.config.cluster import ClusterConfigError, parse_cluster_config
from events.domain.deciders import Refusal
from events.domain.deciders.webhooks import (
    ChangeWebhookUrl,
    CreateWebhook,
    DeleteWebhook,
    decide_webhook,
)
from events.domain.types.webhooks import Trigger, WebhookCreated, WebhookUrlChanged
from events.domain.webhooks.matching import (
    Alert,
    ExperimentFacts,
    Happening,
    OptIn,
    delivery_id,
    firing,
)
from events.domain.webhooks.payloads import default_body, slack_body
from events.domain.webhooks.urls import (
    Endpoint,
    Endpoints,
    address_problem,
    parse_prefix,
    parse_url,
    url_problem,
)
from services.webhooks import signing
from tests.integration.test_api_support import CONFIG

ip = ipaddress.ip_address
COMPLETED = Trigger(trigger_type="EXPERIMENT_STATE_CHANGE", condition={"state": "COMPLETED"})
ALLOWED = ("https://hooks.slack.com/services/", "https://*.example.com/hooks", "http://*:8080/")


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://hooks.slack.com/services/T0/B0/x", True),
        ("https://hooks.slack.com/other", False),
        ("http://hooks.slack.com/services/x", False),
        ("https://hooks.slack.com:8443/services/x", False),
        ("https://a.example.com/hooks/1", True),
        ("https://a.b.example.com/hooks", True),
        ("https://example.com/hooks", False),
        ("https://evilexample.com/hooks", False),
        ("http://anything.internal:8080/x", True),
        ("http://anything.internal/x", False),
    ],
)
def test_a_url_is_allowed_only_under_a_prefix(url: str, allowed: bool) -> None:
    """Scheme, port and path prefix must match; a host is equal, under ``*.domain``, or ``*``."""
    assert (url_problem(url, ALLOWED) is None) == allowed


def test_without_prefixes_no_url_is_allowed_and_bad_urls_say_why() -> None:
    """The default allows nothing; credentials, fragments and other schemes are refused."""
    assert "allows no webhook URL" in str(url_problem("https://a.example.com/hooks", []))
    assert "user name" in str(url_problem("https://u:p@a.example.com/hooks", ALLOWED))
    assert "fragment" in str(url_problem("https://a.example.com/hooks#x", ALLOWED))
    assert "http://" in str(url_problem("gopher://a.example.com/hooks", ALLOWED))
    assert "spaces" in str(url_problem("https://a.example.com/ hooks", ALLOWED))
    assert parse_url("https://[::1]/x").literal == ip("::1")
    assert parse_prefix("https://*.example.com").host == "*.example.com"
    with pytest.raises(ClusterConfigError, match="allowed_urls"):
        parse_cluster_config({"webhooks": {"allowed_urls": ["ftp://x/"]}})
    with pytest.raises(ClusterConfigError, match="allowed_networks"):
        parse_cluster_config({"webhooks": {"allowed_networks": ["10.0.0.0/99"]}})


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("100.64.0.1", "private"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("fd00::1", "private"),
    ],
)
def test_internal_addresses_are_refused_unless_their_network_is_allowed(
    address: str, kind: str
) -> None:
    """Anything not globally routable is refused, naming its kind, unless allowed."""
    assert kind in str(address_problem(ip(address), 80))
    plain = getattr(ip(address), "ipv4_mapped", None) or ip(address)
    allowed = [ipaddress.ip_network(plain)]
    assert address_problem(ip(address), 80, allowed_networks=allowed) is None
    assert address_problem(ip("93.184.216.34"), 443) is None


def test_the_clusters_own_services_are_refused_whatever_the_networks_allow() -> None:
    """An endpoint listening on all addresses is refused on every local one, on its port."""
    local = ip("10.0.0.5")
    endpoints = Endpoints(
        services=(Endpoint("the API", ip("0.0.0.0"), 8080),), local=frozenset({local})
    )
    everything = [ipaddress.ip_network("0.0.0.0/0")]
    for address in ("127.0.0.1", "10.0.0.5"):
        problem = address_problem(
            ip(address), 8080, allowed_networks=everything, endpoints=endpoints
        )
        assert "the API of this cluster" in str(problem)
    assert (
        address_problem(ip("10.0.0.6"), 8080, allowed_networks=everything, endpoints=endpoints)
        is None
    )
    assert (
        address_problem(ip("127.0.0.1"), 9000, allowed_networks=everything, endpoints=endpoints)
        is None
    )


def create(name: str = "hook", **changes: object) -> CreateWebhook:
    fields: dict[str, object] = {
        "name": name,
        "url": "https://a.example.com/hooks",
        "webhook_type": "default",
        "workspace_id": None,
        "mode": "workspace",
        "triggers": (COMPLETED,),
        "actor": "alice",
        "allowed_urls": ALLOWED,
    }
    fields.update(changes)
    return CreateWebhook(**fields)  # type: ignore[arg-type]


def with_hook(hook_id: int = 1, workspace_id: int | None = None) -> Webhooks:
    state = Webhooks(last_webhook_id=hook_id)
    state.webhooks[hook_id] = Webhook(
        hook_id, "hook", "https://a.example.com/hooks", "default", workspace_id, "workspace",
        (COMPLETED,), "alice",
    )  # fmt: skip
    return state


def test_the_decider_creates_changes_and_deletes() -> None:
    """Ids are the next free one; names are unique per workspace; a URL change to the same URL
    records nothing; an unknown workspace or webhook is not found."""
    [made] = decide_webhook(Webhooks(), Teams(), create())  # type: ignore[misc]
    assert isinstance(made, WebhookCreated) and made.webhook_id == 1
    state = with_hook()
    refused = decide_webhook(state, Teams(), create())
    assert isinstance(refused, Refusal) and refused.reason == "conflict"
    [other] = decide_webhook(state, Teams(), create(workspace_id=1))  # type: ignore[misc]
    assert other.webhook_id == 2
    missing = decide_webhook(state, Teams(), create(workspace_id=99))
    assert isinstance(missing, Refusal) and missing.reason == "not_found"
    url = "https://b.example.com/hooks"
    [changed] = decide_webhook(state, Teams(), ChangeWebhookUrl(1, url, ALLOWED))  # type: ignore[misc]
    assert isinstance(changed, WebhookUrlChanged) and changed.url == url
    assert decide_webhook(state, Teams(), ChangeWebhookUrl(1, state.webhooks[1].url, ALLOWED)) == []
    bad = decide_webhook(state, Teams(), ChangeWebhookUrl(1, "https://evil.test/", ALLOWED))
    assert isinstance(bad, Refusal) and bad.field == "url"
    gone = decide_webhook(state, Teams(), DeleteWebhook(7))
    assert isinstance(gone, Refusal) and gone.reason == "not_found"


@pytest.mark.parametrize(
    ("triggers", "mode", "message"),
    [
        ((), "workspace", "at least one"),
        ((COMPLETED, COMPLETED), "workspace", "twice"),
        ((Trigger(trigger_type="CUSTOM"),), "workspace", "specific"),
        ((Trigger(trigger_type="CUSTOM", condition={"state": "x"}),), "specific", "no condition"),
        ((Trigger(trigger_type="TASK_STATE_CHANGE", condition={"state": "COMPLETED"}),),
         "workspace", "not a state"),
        ((Trigger(trigger_type="TRIAL_STATE_CHANGE", condition={"regex": "x"}),),
         "workspace", "exactly"),
    ],
)  # fmt: skip
def test_the_decider_refuses_bad_triggers(
    triggers: tuple[Trigger, ...], mode: str, message: str
) -> None:
    """Each malformed trigger list is refused with a message naming the problem."""
    refused = decide_webhook(Webhooks(), Teams(), create(triggers=triggers, mode=mode))
    assert isinstance(refused, Refusal) and message in refused.message


def facts(opt_in: OptIn = OptIn(), workspace_id: int = 2) -> ExperimentFacts:
    return ExperimentFacts(
        experiment_id=7, name="mnist", state="COMPLETED", owner="alice",
        workspace_id=workspace_id, workspace="vision", project="det", duration=3725,
        opt_in=opt_in,
    )  # fmt: skip


def happening(opt_in: OptIn = OptIn(), workspace_id: int = 2) -> Happening:
    return Happening(
        event_id="e1", position=10, at=datetime(2024, 1, 2, tzinfo=UTC),
        trigger_type="EXPERIMENT_STATE_CHANGE", state="COMPLETED",
        experiment=facts(opt_in, workspace_id),
    )  # fmt: skip


def hook(
    hook_id: int, workspace_id: int | None, mode: str = "workspace", name: str = ""
) -> Webhook:
    return Webhook(hook_id, name or f"h{hook_id}", "https://x", "default", workspace_id,
                   mode, (COMPLETED,), "alice")  # type: ignore[arg-type]  # fmt: skip


def test_firing_follows_scope_mode_opt_in_and_exclude() -> None:
    """Global and same-workspace webhooks fire; another workspace's does not; a specific one
    fires only when named by id or name; exclude silences all; a state must match."""
    hooks = [hook(1, None), hook(2, 2), hook(3, 3), hook(4, None, "specific", "pager"),
             hook(5, 2, "specific")]  # fmt: skip
    fired = [h.webhook_id for h, _ in firing(hooks, happening())]
    assert fired == [1, 2]
    named = OptIn(webhook_ids=frozenset({5}), webhook_names=frozenset({"pager"}))
    assert [h.webhook_id for h, _ in firing(hooks, happening(named))] == [1, 2, 4, 5]
    assert firing(hooks, happening(OptIn(exclude=True))) == []
    paused = Happening(**{**happening().__dict__, "state": "PAUSED"})
    assert firing(hooks, paused) == []
    config = parse_config(
        CONFIG + "integrations: {webhooks: {webhook_id: [5], webhook_name: [pager]}}\n",
        default_seed=1,
    )
    assert OptIn.of_config(config.to_dict()) == named
    assert not [w for w in config.warnings if w.path.startswith("integrations")]


def test_payloads_have_determineds_shapes() -> None:
    """The default body carries the delivery id as event_id and the experiment's fields; the
    Slack body has a status line and a coloured attachment; an alert's level is spelled out and
    its text cannot make a Slack link or mention."""
    did = delivery_id("e1", 3)
    assert did == delivery_id("e1", 3) != delivery_id("e1", 4)
    body = default_body(did, happening())
    assert body["event_id"] == body["delivery_id"] == did
    assert body["timestamp"] == int(datetime(2024, 1, 2, tzinfo=UTC).timestamp())
    assert body["event_data"]["experiment"]["duration"] == 3725
    assert body["condition"] == {"state": "COMPLETED"}
    slack = slack_body(happening(), "https://cairn.example/")
    assert slack["blocks"][0]["text"]["text"] == "Experiment mnist (#7) completed"
    section = slack["attachments"][0]["blocks"][0]
    assert section["text"]["text"].startswith("✅ <https://cairn.example/#/experiments/7|")
    assert {"type": "mrkdwn", "text": "*Duration*: 1h 2min"} in section["fields"]
    alert = Happening(
        **{**happening().__dict__, "trigger_type": "CUSTOM", "state": None, "trial_id": 71,
           "alert": Alert("loss", "nan", "warn")}
    )  # fmt: skip
    assert default_body(did, alert)["event_data"]["custom_data"]["level"] == "WARNING"
    assert slack_body(alert)["blocks"][0]["fields"][0]["text"] == "*Level*: WARNING"
    hostile = Happening(
        **{**alert.__dict__, "alert": Alert("<!channel> <https://evil|x>", "&", "info")}
    )
    fields = slack_body(hostile)["blocks"][0]["fields"]
    assert fields[1]["text"] == "*Title*: &lt;!channel&gt; &lt;https://evil|x&gt;"
    assert fields[2]["text"] == "*Description*: &amp;"


def test_a_signature_verifies_only_for_its_key_timestamp_and_body() -> None:
    """HMAC-SHA256 over "<timestamp>,<body>" under the webhook's own key."""
    key = signing.webhook_key(b"secret", 1)
    assert key != signing.webhook_key(b"secret", 2) and len(key) == 64
    headers = signing.headers(key, 1700000000, b'{"a":1}', "d1")
    mac = headers[signing.SIGNATURE]
    assert headers[signing.DETERMINED_SIGNATURE] == mac
    assert signing.verify(key, "1700000000", b'{"a":1}', mac)
    assert not signing.verify(key, "1700000001", b'{"a":1}', mac)
    assert not signing.verify(key, "1700000000", b'{"a":2}', mac)
    assert not signing.verify(signing.webhook_key(b"secret", 2), "1700000000", b'{"a":1}', mac)
