"""What the request handlers share: reading a JSON body into a schema, and the client-gone error."""

from __future__ import annotations

import json
from typing import TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from service.errors import InvalidJSON, ServiceError

JSON_TYPE = "application/json"
Schema = TypeVar("Schema", bound=BaseModel)


class ClientClosedRequest(ServiceError):
    """The client went away before its answer was ready (nginx's 499); nobody reads this answer."""

    status, code = 499, "client_closed_request"


def validated(schema: type[Schema], data: object) -> Schema:
    """``data`` as ``schema``; pydantic's errors become the same 422 FastAPI gives for its own."""
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False, include_input=False)) from e


def parse_json_body(raw: bytes, schema: type[Schema]) -> Schema:
    """A JSON body validated as ``schema``: 400 ``invalid_json`` if it does not parse, 422 if it does not fit."""
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidJSON(f"body is not valid JSON: {e}") from e
    return validated(schema, payload)
