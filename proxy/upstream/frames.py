"""Text deltas read by their frame: the bytes around their text, learned from one parsed delta.

Most of a streamed reply is text deltas that differ only in their text. Once one delta has been
parsed, the bytes before and after its text (its frame) are known; a later event that starts and
ends with them, and holds one JSON string between, is that delta with another text: read by the
string alone (one `startswith`, one `endswith`, a parse of the string), not parsed and walked
whole. Exact, as JSON is context-free: the frame is proven when learned (its bytes around another
string parse as the same delta with that string), and no string token changes how the bytes
around it parse. A stream whose frames keep changing (a field new in every event) is parsed event
by event after MAX_FRAMES tries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

MAX_FRAMES = 4  # frames learned per stream at most
PROBE = "?"  # the string a frame is proven with

# (the bytes before the text, the bytes after it)
Frame = tuple[bytes, bytes]


def learn(data: bytes, text: str, parse: Callable[[bytes], Any], expected: Any) -> Frame | None:
    """`data`'s frame around `text` (written as orjson writes it: as JavaScript and most servers
    do), if `parse` of the frame around PROBE gives `expected` (the parsed delta with PROBE for
    its text); else None (the text written otherwise, or found where it is not the text)."""
    written = orjson.dumps(text)
    at = data.find(written)
    if at < 0:
        return None
    before, after = data[:at], data[at + len(written) :]
    try:
        probe = parse(before + orjson.dumps(PROBE) + after)
    except ValueError:
        return None
    return (before, after) if probe == expected else None


def read(frame: Frame, data: bytes) -> str | None:
    """The text of `data` if it is a delta in `frame`, else None."""
    before, after = frame
    if not data.startswith(before) or not data.endswith(after):
        return None
    middle = data[len(before) : len(data) - len(after)]
    if middle[:1] != b'"':
        return None
    try:
        text = orjson.loads(middle)
    except ValueError:
        return None
    return text if type(text) is str else None
