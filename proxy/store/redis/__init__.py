"""The Redis store, for several replicas: store.py is the backend (`RedisStore`: conversations and
their items, every write one Lua script, atomic across replicas); inbox.py, knowledge.py and
request_parts.py its other areas (area.py: what each runs on); calls.py what every call goes
through (Redis's failures as the store's errors, the store's health); records.py the
conversation snapshots a replica keeps and brings up to date by what changed; lua/ the scripts,
one `.lua` file each, loaded at import."""

from .store import LUA_CONSTANTS, SCRIPTS, RedisStore

__all__ = ["LUA_CONSTANTS", "SCRIPTS", "RedisStore"]
