"""``cairn experiment list`` and ``describe`` mark unmanaged experiments."""

from __future__ import annotations

import pytest

from cairn.cli import experiment


def test_list_and_describe_mark_an_unmanaged_experiment(capsys: pytest.CaptureFixture[str]) -> None:
    """An unmanaged experiment's name carries the marker in lists; describe says so with its
    external id; a managed one shows neither."""
    assert experiment._name({"name": "run", "unmanaged": True}) == "run [unmanaged]"
    assert experiment._name({"name": "run", "unmanaged": False}) == "run"
    experiment.describe_one({"id": 3, "state": "ACTIVE", "unmanaged": True, "external_id": "e-1"})
    assert "yes (external id e-1)" in capsys.readouterr().out
    experiment.describe_one({"id": 4, "state": "ACTIVE"})
    assert "unmanaged" not in capsys.readouterr().out
