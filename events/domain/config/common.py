"""Building blocks shared by the config models: the base model, ``Length`` and error helpers."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, model_validator
from pydantic_core import PydanticCustomError

from events.domain.config.errors import CAIRN_ERROR
from events.domain.config.limits import MAX_COUNT

NonNegInt = Annotated[int, Field(ge=0, le=MAX_COUNT)]
PositiveInt = Annotated[int, Field(ge=1, le=MAX_COUNT)]


class ConfigModel(BaseModel):
    """Base of every config model: immutable, unknown keys rejected, no type coercion."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


def field_error(field: str | None, message: str) -> PydanticCustomError:
    """An error about ``field`` of the model being validated (``None``: the model itself)."""
    return PydanticCustomError(CAIRN_ERROR, "{message}", {"field": field, "message": message})


def issues_error(issues: list[tuple[tuple[str | int, ...], str]]) -> PydanticCustomError:
    """An error carrying several ``(relative path, message)`` problems at once."""
    summary = "; ".join(msg for _, msg in issues)
    return PydanticCustomError(CAIRN_ERROR, "{summary}", {"issues": issues, "summary": summary})


def shape_of(value: Any) -> str | None:
    """Names the JSON shape of ``value`` (used to pick a member of a shape-tagged union)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "str"
    if isinstance(value, int):
        return "int"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, dict | BaseModel):
        return "map"
    return None


def shape_union(expected: str) -> Discriminator:
    """A discriminator choosing a union member by JSON shape; a mismatch says ``expected``."""
    return Discriminator(
        shape_of,
        custom_error_type=CAIRN_ERROR,
        custom_error_message=f"must be {expected}",
    )


class Length(ConfigModel):
    """A training length in exactly one unit: ``{batches: N}``, ``{records: N}``, ``{epochs: N}``."""

    batches: NonNegInt | None = None
    records: NonNegInt | None = None
    epochs: NonNegInt | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Length:
        given = [k for k in ("batches", "records", "epochs") if getattr(self, k) is not None]
        if len(given) != 1:
            found = ", ".join(given) or "none"
            raise field_error(
                None, f"must set exactly one of batches, records, epochs (found: {found})"
            )
        return self

    @property
    def unit(self) -> str:
        """The unit's name: ``batches``, ``records`` or ``epochs``."""
        for key in ("batches", "records", "epochs"):
            if getattr(self, key) is not None:
                return key
        raise AssertionError("validated Length has a unit")

    @property
    def units(self) -> int:
        """How many units."""
        value = getattr(self, self.unit)
        assert isinstance(value, int)
        return value


def length_from_int(value: Any) -> Any:
    """Legacy searcher lengths accept a bare integer, meaning batches."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"batches": value}
    return value
