"""Typed parameters shared by every router: ids are PostgreSQL bigints.

Every row id in the schema is a `bigint` (bigserial) starting at 1, so an id outside
1..2^63-1 can name nothing. Declaring that once, in the parameter's type, refuses such an id as
`invalid_request` (422) before any database work, for every route alike; before, 2^64 reached a
bigint function argument and answered 500, while 0 or -1 answered the resource's 404. One rule:
an id that cannot exist is a malformed request (422); an id that could exist but does not is the
resource's own not-found code (404).

- `IdPath`: an id in the URL path (`/v1/holds/{hold_id}/release`);
- `IdQuery`: an id in the query string (`?account_id=`);
- `Id`: an id in a JSON body (`"account_id": 7`).

Paging cursors (`after`, an id or 0 for "from the start") take `le=MAX_ID` in their `Query`.
"""
from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query
from pydantic import Field

MAX_ID = 2**63 - 1

IdPath = Annotated[int, Path(ge=1, le=MAX_ID, description="a row id: 1 to 2^63-1")]
IdQuery = Annotated[int, Query(ge=1, le=MAX_ID, description="a row id: 1 to 2^63-1")]
Id = Annotated[int, Field(ge=1, le=MAX_ID, description="a row id: 1 to 2^63-1")]
