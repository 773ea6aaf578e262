"""Request bodies shared by several routers."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CommentIn(BaseModel):
    """An operator's decision with the comment recorded in the audit log (approve, reject, release,
    abandon)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={'examples': [{'comment': 'checked with the customer by phone, ticket 4711'}]})
    comment: str = Field(min_length=1, max_length=1000)
