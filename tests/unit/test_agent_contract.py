"""The agent <-> gateway wire models are one contract: what the gateway serializes, the agent
parses into the same run, and a spec the contract does not describe is refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from events.domain.aggregates import AllocationView, ExperimentView, TrialView
from events.domain.types import TrialRequested
from services.agent import client as agent_client
from services.agent.runtime import MalformedSpecError, RunSpec
from services.api import routes_agents, routes_allocations, routes_rendezvous
from services.api.views import build_spec
from services.contracts import agent as wire

CONFIG: dict[str, Any] = {
    "entrypoint": "python3 train.py --fast",
    "checkpoint_storage": {"type": "shared_fs", "host_path": "/mnt/ckpt"},
    "environment": {"environment_variables": {"cpu": ["MODE=cpu"], "cuda": ["MODE=gpu"]}},
    "preemption_timeout": 30,
}


def _views() -> tuple[ExperimentView, TrialView]:
    """An experiment with one requested trial whose second run spans two agents."""
    requested = TrialRequested(
        experiment_id=4,
        trial_id=17,
        seq=1,
        request_id="r1",
        hparams={"lr": 0.1, "layers": 3},
        trial_seed=99,
    )
    experiment = ExperimentView(
        experiment_id=4,
        submitted=True,
        config=CONFIG,
        code_ref="sha256-abc",
        owner="alice",
        trials={17: requested},
    )
    placements = {"gpu01": ["0", "1"], "gpu02": ["0"]}
    alloc = AllocationView(allocation_id="17.2", run_id=2, placements=placements)
    trial = TrialView(trial_id=17, allocations={"17.2": alloc}, latest_allocation="17.2")
    return experiment, trial


def _served(agent_user_group: dict[str, Any] | None = None) -> dict[str, Any]:
    """The spec's JSON exactly as ``GET /allocations/{id}/spec`` writes it."""
    experiment, trial = _views()
    spec = build_spec(
        experiment,
        trial,
        "17.2",
        agent_id="gpu02",
        device="cuda",
        token="trial-token",
        cluster_id="lab",
        agent_user_group=agent_user_group,
    )
    decoded: dict[str, Any] = json.loads(
        json.dumps(spec.model_dump(mode="json", exclude_unset=True))
    )
    return decoded


def test_a_spec_the_gateway_serves_parses_in_the_agent_into_the_same_run() -> None:
    """Every field the gateway writes reaches the agent's run: slots, ranks, entrypoint,
    environment, checkpoint directory, identity."""
    group = {
        "agent_uid": 2_000_000_001,
        "agent_gid": 2_000_000_001,
        "agent_user": "alice",
        "agent_group": "alice",
        "linked": False,
    }
    served = _served(group)
    assert served["agent_user_group"] == group
    run = RunSpec.from_api(served, "gpu02", Path("/var/ckpt"))
    assert (run.allocation_id, run.trial_id, run.experiment_id, run.run_id) == ("17.2", 17, 4, 2)
    assert run.argv == ["python3", "train.py", "--fast"]
    assert (run.slot_ids, run.node_rank, run.num_nodes) == (["0"], 1, 2)
    assert (run.rank_offset, run.world_size) == (2, 3)
    assert run.hparams == {"lr": 0.1, "layers": 3} and run.trial_seed == 99
    assert run.environment == {"MODE": "gpu"}
    assert run.checkpoint_dir == Path("/mnt/ckpt")
    assert run.preemption_timeout == 30.0
    assert (run.token, run.user, run.cluster_id, run.code_ref) == (
        "trial-token",
        "alice",
        "lab",
        "sha256-abc",
    )
    assert run.identity is not None and run.identity.uid == 2_000_000_001


def test_a_spec_without_an_identity_omits_the_field_as_before() -> None:
    """With no owner identity the answer has no ``agent_user_group`` key, and the agent runs
    the code as no particular identity."""
    served = _served()
    assert "agent_user_group" not in served
    assert RunSpec.from_api(served, "gpu01", Path("/var/ckpt")).identity is None


def test_an_unknown_field_in_a_spec_is_refused_by_name() -> None:
    """A field the contract does not name is an error that names it, never silently dropped."""
    served = {**_served(), "gpu_quota": 3}
    with pytest.raises(MalformedSpecError, match=r"gpu_quota: Extra inputs are not permitted"):
        RunSpec.from_api(served, "gpu02", Path("/var/ckpt"))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("trial_id", "seventeen", r"trial_id: Input should be a valid integer"),
        ("placements", {"gpu01": "0"}, r"placements\.gpu01: Input should be a valid list"),
        ("token", None, r"token: Input should be a valid string"),
    ],
)
def test_a_malformed_field_in_a_spec_is_refused_by_name(
    field: str, value: object, message: str
) -> None:
    """A mistyped field fails the launch with a ValueError naming the field and the
    allocation (the agent reports such a launch as the run's exit)."""
    served = {**_served(), field: value}
    with pytest.raises(MalformedSpecError, match=message) as caught:
        RunSpec.from_api(served, "gpu02", Path("/var/ckpt"))
    assert isinstance(caught.value, ValueError)
    assert "'17.2'" in str(caught.value)


def test_a_missing_field_in_a_spec_is_refused_by_name() -> None:
    """A spec without a field the gateway always sends is refused, naming the field."""
    served = _served()
    del served["slot_ids"]
    with pytest.raises(MalformedSpecError, match=r"slot_ids: Field required"):
        RunSpec.from_api(served, "gpu02", Path("/var/ckpt"))


def test_the_gateway_routes_and_the_agent_use_the_one_contract() -> None:
    """Each agent-facing route's body and answer model is the contract's own class, so the two
    sides cannot drift apart."""
    assert routes_allocations.SpecResponse is wire.SpecResponse
    assert routes_allocations.StartedBody is wire.StartedBody
    assert routes_allocations.ExitedBody is wire.ExitedBody
    assert routes_allocations.LogsBody is wire.LogsBody
    assert routes_allocations.PreemptionResponse is wire.PreemptionResponse
    assert routes_agents.RegisterBody is wire.RegisterBody
    assert routes_agents.HeartbeatBody is wire.HeartbeatBody
    assert routes_agents.JoinResponse is wire.JoinResponse
    assert routes_rendezvous.RendezvousJoinBody is wire.RendezvousJoinBody
    assert routes_rendezvous.RendezvousResponse is wire.RendezvousResponse
    assert agent_client.StartedBody is wire.StartedBody
    assert agent_client.RendezvousResponse is wire.RendezvousResponse


def test_the_agent_sends_only_the_fields_it_sets() -> None:
    """A request body carries the fields the agent chose and nothing defaulted, so an exit
    report without ``agent_shutdown`` reads as it did from older agents."""
    body = agent_client._body(
        wire.ExitedBody, agent_id="gpu01", exit_code=1, message="", idempotency_key="k"
    )
    assert body == {"agent_id": "gpu01", "exit_code": 1, "message": "", "idempotency_key": "k"}


def test_a_body_the_gateway_would_refuse_fails_in_the_agent_as_its_422() -> None:
    """An invalid body is refused before it is sent, as the same error the gateway's 422
    would raise."""
    with pytest.raises(agent_client.ApiError) as caught:
        agent_client._body(wire.HeartbeatBody, incarnation="not/valid", seq=1)
    assert caught.value.status == 422
    assert "incarnation" in caught.value.message
