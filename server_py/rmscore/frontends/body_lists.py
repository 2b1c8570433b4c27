"""The HTTP request models' lists: bounded, and reported by their first bad item, before pydantic reads them.

pydantic reports one error per bad item of a list, and FastAPI turns every one into a dict before
any handler sees them. A 14 MiB body of five million empty arrays where `sequences` belongs took
3.3 s to validate and 26 s and 6 GB more to convert (two such requests took py-http to +5.7 GB, and
every probe timed out): one body, and one caller, held the event loop for half a minute. So each
list a request model takes is checked first, at C speed, for what makes many errors:
- more items than any request may carry (MOST_LIST_ITEMS; a list of token ids is bounded by the
  validator's own rule instead, INPUT_FACTOR x max_sequence_length): one error, no item read;
- an item of another type than the list's: pydantic validates the list only up to that item, so the
  error it gives is the one it gave first before, with its place (`sequences.3: Input should be ...`),
  and no other.
Lists of the right type within the bound are validated as before, each item's content included.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

from pydantic import ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticCustomError

from rmscore.core.validation import MOST_LIST_ITEMS


def first_not(value: list, kind: type) -> int | None:
    """The index of the first item of `value` whose type is not exactly `kind` (a C loop), or None."""
    try:
        return operator.indexOf(map(operator.is_, map(type, value), itertools.repeat(kind)), False)
    except ValueError:
        return None


def _too_long(n: int, most: int) -> PydanticCustomError:
    return PydanticCustomError("too_long", "List should have at most {max_length} items, not {actual_length}",
                               {"max_length": most, "actual_length": n})


def _check(value: list, kind: type, most: int | None, handler: ValidatorFunctionWrapHandler) -> None:
    if most is not None and len(value) > most:
        raise _too_long(len(value), most)
    j = first_not(value, kind)
    if j is not None:
        handler(value[:j + 1])  # raises pydantic's own error for item j, and only it


def items_of(kind: type, most: int | None = MOST_LIST_ITEMS) -> WrapValidator:
    """For a field that is a list of `kind` (or a union in which a list is one): at most `most` items
    (None: no bound here), and a wrong item reported alone."""
    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if type(value) is list:
            _check(value, kind, most, handler)
        return handler(value)
    return WrapValidator(check)


def ids_or_texts() -> WrapValidator:
    """For vLLM's `input` (list[int] | list[list[int]] | str | list[str]): the list's items all of the
    first item's type, and a list of lists all ids, or one error saying where not. (Each member of the
    union reports its own errors, so even the list up to the first wrong item gave one error per item
    before it, for every member.) A list of ids is not bounded here (the validator bounds it); a list
    of prompts or of lists of ids is, by MOST_LIST_ITEMS."""
    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if type(value) is list and value:
            kind = type(value[0])
            if kind is not int and len(value) > MOST_LIST_ITEMS:
                raise _too_long(len(value), MOST_LIST_ITEMS)
            j = first_not(value, kind)
            if j is not None:
                raise PydanticCustomError(
                    "list_type", "item {j} is a {other}, item 0 a {first}: send token ids, lists of token ids, "
                    "or texts", {"j": j, "other": type(value[j]).__name__, "first": kind.__name__})
            if kind is list:
                for k, ids in enumerate(value):
                    i = first_not(ids, int)
                    if i is not None:
                        raise PydanticCustomError("int_type", "item {k}, id {i}: Input should be a valid integer",
                                                  {"k": k, "i": i})
        return handler(value)
    return WrapValidator(check)
