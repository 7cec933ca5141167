"""The embedded store: one SQLite database (diskcache's) in one directory, for one proxy process.

store.py is the backend (`DiskStore`: conversations and their items) and says how its rows are
laid out; inbox.py, knowledge.py and request_parts.py are its other areas (area.py: what each runs on); rows.py writes them;
keys.py names them; records.py and held.py are what the store thread keeps of a conversation in
memory; pending.py the crash-recovery flags; faults.py its errors, private files and reserve;
worker.py the one thread every write runs on; checkpoints.py SQLite's checkpoints beside it.
"""

from .held import MAX_HELD_ENTRIES
from .pending import SETTLED_FLAGS
from .records import BATCH_MAX, INDEX_CHUNK, INLINE_PART
from .store import DiskStore, open_cache

__all__ = ["BATCH_MAX", "INDEX_CHUNK", "INLINE_PART", "MAX_HELD_ENTRIES", "SETTLED_FLAGS", "DiskStore", "open_cache"]
