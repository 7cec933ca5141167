"""The Redis store, for several replicas: store.py is the backend (`RedisStore`: every write one
Lua script, atomic across replicas); records.py the conversation snapshots a replica keeps and
brings up to date by what changed; lua/ the scripts, one `.lua` file each, loaded at import."""

from .store import LUA_CONSTANTS, SCRIPTS, RedisStore

__all__ = ["LUA_CONSTANTS", "SCRIPTS", "RedisStore"]
