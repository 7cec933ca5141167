"""Text deltas read by their frame: the bytes around their text, learned from one parsed delta.

Most of a streamed reply is text deltas that differ only in their text. Once one delta has been
parsed, the bytes around its text (its frame) are known; a later event that starts and ends with
them, and holds one JSON string between, is that delta with another text: read by the string
alone (one `startswith`, one `endswith`, a parse of the string), not parsed and walked whole. A
frame may hold a second string after the text, one the reader ignores (OpenAI's `obfuscation`,
new in every chunk). Exact, as JSON is context-free: the frame is proven when learned (its bytes
around other strings parse as the same delta with those strings), and no string token changes
how the bytes around it parse. A stream whose frames keep changing (another field new in every
event) is parsed event by event after MAX_FRAMES tries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

MAX_FRAMES = 4  # frames learned per stream at most
PROBE, PROBE_NUMBER = "?", 7  # what a frame is proven with, in a string's place and a number's

# The bytes around a delta's strings: before the text, (between it and the ignored string,) after the last.
Frame = tuple[bytes, ...]


def learn(data: bytes, values: tuple[str | int, ...], parse: Callable[[bytes], Any], expected: Any) -> Frame | None:
    """`data`'s frame around `values` (its text, then perhaps a string to ignore; or first a
    number the reader knows, as a Responses event's `sequence_number`), each written as orjson
    writes it (as JavaScript and most servers do) and found in that order, if `parse` of the frame
    around PROBE (a string's place) and PROBE_NUMBER (a number's) gives `expected` (the parsed
    delta with those in their places); else None (a value written otherwise, or found where it is
    not that field)."""
    pieces, at = [], 0
    for value in values:
        written = orjson.dumps(value)
        found = data.find(written, at)
        if found < 0:
            return None
        pieces.append(data[at:found])
        at = found + len(written)
    pieces.append(data[at:])
    probe = pieces[0]
    for value, piece in zip(values, pieces[1:], strict=True):
        probe += orjson.dumps(PROBE_NUMBER if type(value) is int else PROBE) + piece
    try:
        parsed = parse(probe)
    except ValueError:
        return None
    return tuple(pieces) if parsed == expected else None


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


def _string(data: bytes) -> str | None:
    """`data` parsed if it is one JSON string, else None."""
    if data[:1] != b'"':
        return None
    try:
        value = orjson.loads(data)
    except ValueError:
        return None
    return value if type(value) is str else None
