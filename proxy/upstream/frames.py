"""Text deltas read by their frame: the bytes around their text, learned from one parsed delta.

Most of a streamed reply is text deltas that differ only in their text. Once one delta has been
parsed, the bytes around its text (its frame) are known; a later event that starts and ends with
them, and holds one JSON string between, is that delta with another text: read by the string
alone (one `startswith`, one `endswith`, a parse of the string), not parsed and walked whole. A
frame may hold a second string after the text, one the reader ignores (OpenAI's `obfuscation`,
new in every chunk), or an object it reads whole (Gemini's `usageMetadata`, cumulative on every
chunk); a Responses frame holds the place of the event's number too (its reader checks it).
Exact, as JSON is context-free: the frame is proven when learned (its bytes
around other strings parse as the same delta with those strings), and no string token changes
how the bytes around it parse. A stream whose frames keep changing (another field new in every
event) is parsed event by event after MAX_FRAMES tries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

MAX_FRAMES = 4  # frames learned per stream at most
PROBE, PROBE_NUMBER = "?", 7  # what a frame is proven with, in a string's (or an object's) place and a number's

# The bytes around a delta's strings: before the text, (between it and the ignored string,) after the last.
Frame = tuple[bytes, ...]


def learn(data: bytes, values: tuple[Any, ...], parse: Callable[[bytes], Any], expected: Any) -> Frame | None:
    """`data`'s frame around `values`, found in that order: its text, then perhaps a string to
    ignore; or first a number the reader knows (a Responses event's `sequence_number`); or an
    object after the text (Gemini's `usageMetadata`, new in every chunk). A string or a number is
    found as orjson writes it (as JavaScript and most servers do), an object as whatever bytes
    parse to it. The frame holds if `parse` of it around PROBE (a string's or an object's place)
    and PROBE_NUMBER (a number's) gives `expected` (the parsed delta with those in their places);
    else None (a value written otherwise, or found where it is not that field)."""
    pieces, at = [], 0
    for value in values:
        span = _object_at(data, value, at) if type(value) is dict else _written_at(data, value, at)
        if span is None:
            return None
        pieces.append(data[at : span[0]])
        at = span[1]
    pieces.append(data[at:])
    probe = pieces[0]
    for value, piece in zip(values, pieces[1:], strict=True):
        probe += orjson.dumps(PROBE_NUMBER if type(value) is int else PROBE) + piece
    try:
        parsed = parse(probe)
    except ValueError:
        return None
    return tuple(pieces) if parsed == expected else None


def _written_at(data: bytes, value: Any, at: int) -> tuple[int, int] | None:
    written = orjson.dumps(value)
    found = data.find(written, at)
    return (found, found + len(written)) if found >= 0 else None


def _object_at(data: bytes, value: dict[str, Any], at: int, most: int = 16) -> tuple[int, int] | None:
    """Where the first bytes from `at` that parse as `value` are: an object starts at a `{` and
    ends at the first `}` its bytes close at (no shorter run of them parses); `most` of each tried."""
    start = at - 1
    for _ in range(most):
        start = data.find(b"{", start + 1)
        if start < 0:
            return None
        end = start
        for _ in range(most):
            end = data.find(b"}", end + 1)
            if end < 0:
                break
            try:
                parsed = orjson.loads(data[start : end + 1])
            except ValueError:
                continue
            if parsed == value:
                return start, end + 1
            break  # the object that starts here is another
    return None


def read(frame: Frame, data: bytes) -> str | None:
    """The text of `data` if it is a delta in `frame`, else None. With a second string, any cut
    of the middle into two strings around the bytes between them is the parse (a JSON text has
    one): the first place those bytes are found is tried."""
    before, after = frame[0], frame[-1]
    if not data.startswith(before) or not data.endswith(after):
        return None
    middle = data[len(before) : len(data) - len(after)]
    if len(frame) == 3:
        cut = middle.find(frame[1])
        if cut < 0 or _string(middle[cut + len(frame[1]) :]) is None:
            return None
        middle = middle[:cut]
    return _string(middle)


def read_values(frame: Frame, data: bytes, kinds: tuple[type, ...]) -> list[Any] | None:
    """The values of `data` in `frame`'s holes, one of each of `kinds` (str, dict) in order, if it
    is a delta in `frame`, else None. `read` is its fast form for a text (and a string ignored):
    each hole's value ends at the first place the bytes after it are found (any cut into values
    of those kinds is the parse, as in `read`)."""
    before, after = frame[0], frame[-1]
    if not data.startswith(before) or not data.endswith(after):
        return None
    middle = data[len(before) : len(data) - len(after)]
    values: list[Any] = []
    at = 0
    for n, kind in enumerate(kinds):
        between = frame[n + 1] if n + 2 < len(frame) else None
        cut = middle.find(between, at) if between is not None else len(middle)
        if cut < 0:
            return None
        value = _string(middle[at:cut]) if kind is str else _object(middle[at:cut])
        if value is None:
            return None
        values.append(value)
        at = cut + len(between) if between is not None else cut
    return values


def _object(data: bytes) -> dict[str, Any] | None:
    """`data` parsed if it is one JSON object, else None."""
    try:
        value = orjson.loads(data)
    except ValueError:
        return None
    return value if type(value) is dict else None


def _string(data: bytes) -> str | None:
    """`data` parsed if it is one JSON string, else None."""
    if data[:1] != b'"':
        return None
    try:
        value = orjson.loads(data)
    except ValueError:
        return None
    return value if type(value) is str else None
