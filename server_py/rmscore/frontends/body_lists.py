"""The HTTP request models' lists: bounded, and validated only up to their first bad item.

pydantic reports one error per bad item of a list, and FastAPI turns every one into a dict before
any handler sees them. A 14 MiB body of five million empty arrays where `sequences` belongs took
3.3 s to validate and 26 s and 6 GB more to convert (two such requests took py-http to +5.7 GB, and
every probe timed out): one body, and one caller, held the event loop for half a minute. So every
list a request model takes is declared with pydantic's own bounds, checked in its Rust core:
- `max_length`: more items than any request may carry (MOST_LIST_ITEMS) is one error, raised as the
  count passes it (pydantic counts while it validates: 65,537 valid items cost ~0.28 s to refuse); a
  list of token ids is bounded by the validator's own rule instead (INPUT_FACTOR x max_sequence_length);
- `fail_fast`: validation stops at the first bad item, whose error, with its place, is the one
  reported first before (`sequences.3: Input should be ...`). A union reports one per member.
Valid lists cost what they did (10.5 ms for 1024 x 512 ids either way; a Python pre-scan of the item
types cost 24 ms more).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from rmscore.core.config import MOST_LIST_ITEMS


def list_of(item: Any, most: int | None = MOST_LIST_ITEMS) -> Any:
    """`list[item]` of at most `most` items (None: not bounded here), validated up to its first bad item."""
    return Annotated[list[item], Field(fail_fast=True, max_length=most)]
