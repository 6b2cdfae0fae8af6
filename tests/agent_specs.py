"""A complete spec answer (``GET /allocations/{id}/spec``) for tests of the agent's runtime,
every field the gateway sends filled with a neutral value unless a test names it."""

from __future__ import annotations

from typing import Any

from services.contracts.agent import SpecResponse


def spec_answer(**fields: Any) -> dict[str, Any]:
    """The JSON of a spec as the gateway sends it, with ``fields`` replacing the defaults
    (validated, so a test cannot hand the agent a spec the gateway would never send)."""
    answer: dict[str, Any] = {
        "active": True,
        "allocation_id": "1.1",
        "trial_id": 1,
        "experiment_id": 1,
        "run_id": 1,
        "entrypoint": None,
        "code_ref": None,
        "hparams": {},
        "trial_seed": 0,
        "latest_checkpoint": None,
        "steps_completed": 0,
        "token": "",
        "checkpoint_storage": None,
        "environment_variables": {},
        "slot_ids": [],
        "placements": {},
        "config": {},
        "user": "",
        "cluster_id": "",
        **fields,
    }
    return SpecResponse.model_validate(answer).model_dump(mode="json", exclude_unset=True)
