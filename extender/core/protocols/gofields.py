"""JSON read the way Go's `encoding/json` accepts it into a struct: what a device plugin written in Go decodes.

A field of the wrong JSON type fails the whole document in Go (so a registration or reservation we read must
fail too, not be half understood); a missing field is the zero value.
"""

from __future__ import annotations

from typing import TypeVar

import orjson

from extender.core.objects import Raw

T = TypeVar("T")

MAX_INT32 = 2**31 - 1
"""HAMi's memory and compute fields are int32 (`ParseInt(s, 10, 32)`)."""


def field(entry: Raw, name: str, kind: type[T], default: T) -> T:
    """A field of a JSON object, of the JSON type Go's decoder accepts (a wrong one fails the whole document)."""
    value = entry.get(name, default)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT32):
        raise ValueError(f"{name} {str(value)[:40]!r} is not a whole number")
    if not isinstance(value, kind):
        raise ValueError(f"{name} {str(value)[:40]!r} is not a {kind.__name__}")
    return value


def json_text(value: object, most_bytes: int) -> object:
    """An annotation's text decoded as JSON, read only when at most `most_bytes` long; ValueError naming what is
    wrong (a value Go's decoder would refuse, or one too long to read)."""
    if not isinstance(value, str) or len(value) > most_bytes:
        raise ValueError(f"not a string of at most {most_bytes // 1024} KiB")
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        raise ValueError("not JSON") from None
