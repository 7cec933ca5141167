"""The Redis store's Lua scripts as files (proxy/store/redis/lua/): the texts sent to Redis, each one
compiled by a real redis-server, and the loader's refusals at start (a missing file, a placeholder
it cannot fill, a constant no script uses)."""

from __future__ import annotations

import hashlib
from importlib.resources import files
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from proxy.store.redis import LUA_CONSTANTS, SCRIPTS, lua
from tests.support.redis_server import RedisServer

# The sha1 of every script as it was when the scripts were Python string constants in
# proxy/store/redis.py (captured from those constants before they moved to .lua files). A change
# to a script's text, meant or not, shows here: update the value knowingly.
TODAYS_SHA1 = {
    "append": "5c9f4ddcb0d1336928d9cb2ad53dddb3cd03ac1e",
    "set_statuses": "ca735bf3fc90348a07adb04ae7c917f129810580",
    "finish_turn": "84608cf0c67545d37d8209963a97d255657ea950",
    "set_title": "3b28982c80383a4d8a140090b5032a842b3dbe93",
    "count_call": "636ec30f2814dc705a69a6de31a7e9d088a6a860",
    "set_fields": "b411b7d69a292a363430069c34892cf9964f9a43",
    "add_summary": "73df82c5e8381158be1aa0d288f514117992c283",
    "fail_pending": "54787eda8bb2cae9251a95fb12ecbb88196d73ad",
    "import": "1363b321fe811508e4a926c8824700d4c54b9352",
    "add_request_parts": "024b29f87f3a409bf24cf1ba2e75114e00fd2f69",
    "messages": "e7f34392f86413711fc138aeacc484f2dd658a83",
    "record": "690e771803137c1685292e73369958f539a94935",
    "post_inbox": "06b80a6a41b5faf387904325d640efe11cb02a77",
    "deliver_inbox": "d9f5bad8c30fad50ebba20bbe31dee301d70bfed",
    "inbox": "4be5e211da2efdce99089b06af7542eaf864ae28",
    "put_knowledge": "98f3665f917e02b5d0fe15843dee05f6591ecb9d",
    "release": "c0fe86dca9a7825a3e95860568351409cafd1294",
    "extend": "36e50646b5b55d9ef4ae981c59532767499f9b3c",
}


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def copy_of_scripts(tmp_path: Path) -> Path:
    """The package's .lua files in a folder of the test's own, to break one of them."""
    folder = tmp_path / "lua"
    folder.mkdir()
    for source in files(lua).iterdir():
        if source.name.endswith(".lua"):
            (folder / source.name).write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    return folder


def test_the_loaded_scripts_are_todays_texts() -> None:
    assert {name: sha1(text) for name, text in SCRIPTS.items()} == TODAYS_SHA1


def test_every_lua_file_is_a_script_or_a_piece_of_one() -> None:
    """A file SCRIPTS does not name would never reach Redis."""
    on_disk = {source.name for source in files(lua).iterdir() if source.name.endswith(".lua")}
    assert on_disk == {f"{name}.lua" for name in (lua.PRELUDE, lua.INBOX_ANCHORS, *lua.SCRIPTS)}


def test_placeholders_are_filled_with_the_constants() -> None:
    assert "${" not in "".join(SCRIPTS.values())
    assert "redis.error_reply('no such conversation')" in SCRIPTS["append"]
    assert "id .. '\0' .. ARGV[i + 1]" in SCRIPTS["import"]  # RESPONSE_SEPARATOR, a NUL as before


async def test_redis_compiles_every_script(redis_server: RedisServer) -> None:
    """SCRIPT LOAD compiles a script without running it, and answers the sha1 EVALSHA will use."""
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        for name, text in SCRIPTS.items():
            assert await client.script_load(text) == TODAYS_SHA1[name], name
    finally:
        await client.aclose()


def test_a_missing_file_fails_the_load(tmp_path: Path) -> None:
    folder = copy_of_scripts(tmp_path)
    (folder / "inbox_anchors.lua").unlink()
    with pytest.raises(FileNotFoundError, match="inbox_anchors.lua"):
        lua.load(LUA_CONSTANTS, folder)


def test_an_unknown_placeholder_fails_the_load(tmp_path: Path) -> None:
    folder = copy_of_scripts(tmp_path)
    release = folder / "release.lua"
    release.write_text(release.read_text().replace("return 0", "return '${NOT_A_CONSTANT}'"))
    with pytest.raises(ValueError, match=r"release\.lua.*NOT_A_CONSTANT"):
        lua.load(LUA_CONSTANTS, folder)


def test_a_constant_no_script_uses_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="STALE"):
        lua.load({**LUA_CONSTANTS, "STALE": "x"}, copy_of_scripts(tmp_path))


def test_a_copy_loads_the_same_scripts(tmp_path: Path) -> None:
    """The failures above come from what was broken, not from loading out of another folder."""
    assert lua.load(LUA_CONSTANTS, copy_of_scripts(tmp_path)) == SCRIPTS
