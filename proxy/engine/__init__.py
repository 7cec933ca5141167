"""The turn engine: one turn from a request's bytes to an outcome, knowing no wire format and no
HTTP framework (see engine.py). Dialects (proxy/dialects) speak the wire formats; the HTTP
handlers (proxy/api/turns.py) only translate."""

from .engine import Engine
from .report import TurnReport
from .request import ClientSink, DryRun, Outcome, ParsedRequest, TurnRequest, TurnWatcher

__all__ = ["ClientSink", "DryRun", "Engine", "Outcome", "ParsedRequest", "TurnReport", "TurnRequest", "TurnWatcher"]
