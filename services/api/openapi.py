"""The OpenAPI 3 document, generated from the route table and the pydantic request models."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from services.api.routing import ANYONE, PUBLIC, Route, RouteTable, state_of

routes = RouteTable("meta")

_PARAM = re.compile(r"{([^}:]+)(?::[^}]*)?}")
_ERRORS = {
    "400": "invalid request (the error's path names the field)",
    "401": "missing or invalid bearer token (on login: wrong username or password)",
    "403": "the token may not do this",
    "404": "not found",
    "409": "not allowed in the current state",
    "413": "the request body, the config in it, or an event it would record is over its size limit",
}


class ErrorBody(BaseModel):
    """Every error: ``{"error": {"message", "path"?}}``."""

    error: dict[str, Any]


def build(
    all_routes: Iterable[Route], *, title: str = "cairn API", version: str = "1"
) -> dict[str, Any]:
    """Builds the OpenAPI 3.1 document describing ``all_routes``."""
    route_list = [route for route in all_routes if not route.hidden]
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [(ErrorBody, "serialization")]
    for route in route_list:
        if route.body is not None:
            models.append((route.body, "validation"))
        if route.response is not None:
            models.append((route.response, "serialization"))
    unique = list(dict.fromkeys(models))
    refs, definitions = models_json_schema(unique, ref_template="#/components/schemas/{model}")
    error_ref = refs[(ErrorBody, "serialization")]
    paths: dict[str, dict[str, Any]] = {}
    for route in route_list:
        path = _PARAM.sub(r"{\1}", route.path)
        op: dict[str, Any] = {
            "summary": route.summary,
            "operationId": route.handler.__name__,
            "tags": [route.tag],
            "parameters": _parameters(route),
            "responses": _responses(route, refs, error_ref),
        }
        if route.allow == PUBLIC:
            op["security"] = []
        else:
            op["x-cairn-allow"] = sorted(route.allow)
        if route.body is not None:
            schema = refs[(route.body, "validation")]
            content: dict[str, Any] = {"application/json": {"schema": schema}}
            if route.multipart:
                content["multipart/form-data"] = {"schema": schema}
            op["requestBody"] = {"required": True, "content": content}
        paths.setdefault(path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _parameters(route: Route) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PARAM.findall(route.path)
    ]
    if route.query is not None:
        schema = route.query.model_json_schema()
        required = set(schema.get("required", []))
        for name, prop in schema.get("properties", {}).items():
            param: dict[str, Any] = {
                "name": name,
                "in": "query",
                "required": name in required,
                "schema": prop,
            }
            if "description" in prop:
                param["description"] = prop["description"]
            params.append(param)
    return params


def _responses(route: Route, refs: Mapping[Any, Any], error_ref: Any) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "success"}
    if route.raw_response is not None:
        ok["content"] = {route.raw_response: {"schema": {"type": "string", "format": "binary"}}}
    elif route.response is not None:
        ok["content"] = {"application/json": {"schema": refs[(route.response, "serialization")]}}
    else:
        ok["content"] = {"application/json": {"schema": {"type": "object"}}}
    out: dict[str, Any] = {"200": ok}
    for status, text in _ERRORS.items():
        if route.allow == PUBLIC and status == "403":
            continue
        if route.method == "GET" and status == "413":
            continue
        out[status] = {"description": text, "content": {"application/json": {"schema": error_ref}}}
    for status, text in (route.more_errors or {}).items():
        out[status] = {"description": text, "content": {"application/json": {"schema": error_ref}}}
        if status == "429":
            out[status]["headers"] = {
                "Retry-After": {
                    "description": "seconds to wait before trying again",
                    "schema": {"type": "integer", "minimum": 1},
                }
            }
    return out


@routes.get("/api/v1/openapi.json", allow=ANYONE)
async def openapi_json(request: web.Request) -> web.Response:
    """This API's OpenAPI 3 document."""
    return web.json_response(build(state_of(request).routes.values()))
