"""Storage faults, against a real proxy: a full disk (a small tmpfs, filled), a read-only one,
a Redis out of memory, a crash mid-turn. Each is a clear 507/503 before the upstream is called,
/healthz says the store is degraded, DELETE still frees room, and nothing stored is lost or
corrupted; once the fault is gone, everything works again."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_sync

from tests.conftest import ALICE
from tests.fakes.fake_upstream import Reply
from tests.support.harness import kill_process, wait_until

AUTH = {"Authorization": f"Bearer {ALICE}"}
BIG = "a tool's long output " * 20_000  # 420 KB: more than a full disk's last free pages


def turn(http: httpx.Client, cid: str, text: str) -> httpx.Response:
    """The conversation's next turn as a full-history client sends it: what is stored, then `text`."""
    known = http.get(f"/v1/conversations/{cid}/messages", params={"limit": 1000})
    before = [{"role": m["role"], "content": m["content"]} for m in known.json()["data"]] if known.status_code == 200 else []
    body = {"model": "gpt-4o-mini", "messages": [*before, {"role": "user", "content": text}]}
    return http.post("/v1/chat/completions", json=body, headers={**AUTH, "X-Conversation-ID": cid})


def live(http: httpx.Client, cid: str) -> list[dict[str, Any]]:
    response = http.get(f"/v1/conversations/{cid}/messages", params={"limit": 1000})
    assert response.status_code == 200, response.text
    return response.json()["data"]


def health(http: httpx.Client) -> tuple[int, dict[str, Any]]:
    response = http.get("/healthz")
    return response.status_code, response.json()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MB tmpfs of this test's own, mounted here and unmounted after."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(mount)], capture_output=True)
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; returns it (delete it to make room again)."""
    filler = disk / "filler"
    block = b"\0" * 65536
    # Unbuffered: the block that does not fit is written in part, and nothing is left to flush at close.
    with open(filler, "wb", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(block)
            out.flush()
    assert os.statvfs(disk).f_bavail == 0
    return filler


def test_a_full_disk_is_a_507_before_forwarding_and_delete_still_frees_room(make_proxy, upstream, small_disk):
    """Issue 12: on a full store every turn failed with internal_error (some after the upstream
    had answered), /healthz said ok, and DELETE failed, so no room could be made."""
    proxy = make_proxy(data_dir=small_disk / "data", storage={"reserve_mb": 2})
    http = httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth)
    for cid in ("keep", "drop"):
        assert turn(http, cid, f"{cid}: " + BIG).status_code == 200
    kept = live(http, "keep")
    forwarded = len(upstream.chat_requests())
    filler = fill(small_disk)

    refused = turn(http, "keep", "one more: " + BIG)
    assert refused.status_code == 507, refused.text
    assert refused.json()["error"]["code"] == "store_full" and refused.json()["error"]["type"] == "server_error"
    assert len(upstream.chat_requests()) == forwarded  # refused before the upstream was called
    status, body = health(http)
    assert status == 503 and body["status"] == "degraded" and body["store"]["status"] == "full", body

    deleted = http.delete("/v1/conversations/drop")
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True, deleted.text
    assert http.get("/v1/conversations/drop").status_code == 404
    assert live(http, "keep") == kept  # nothing stored was lost or corrupted

    filler.unlink()
    wait_until(lambda: health(http)[0] == 200, what="/healthz ok again")
    again = turn(http, "keep", "one more: " + BIG)
    assert again.status_code == 200, again.text
    assert live(http, "keep")[: len(kept)] == kept and len(live(http, "keep")) == len(kept) + 2


@pytest.fixture
def ext4_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MB ext4 image mounted here with errors=remount-ro: an error on it turns it read-only
    under the open store, as a failing disk does (a tmpfs refuses to go read-only while files are
    open for writing)."""
    image, mount = tmp_path / "disk.img", tmp_path / "ext4"
    mount.mkdir()
    with open(image, "wb") as out:
        out.truncate(32 * 1024 * 1024)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True)
    done = made.returncode == 0 and subprocess.run(
        ["mount", "-o", "loop,errors=remount-ro", str(image), str(mount)], capture_output=True
    )
    if not done or done.returncode != 0:
        pytest.skip(f"cannot loop-mount an ext4 image here: {(made.stderr or done.stderr).decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def turn_read_only(disk: Path) -> None:
    """Make ext4 record an error: with errors=remount-ro it goes read-only at once."""
    device = next(d for d in Path("/sys/fs/ext4").iterdir() if (d / "trigger_fs_error").exists()
                  and _mounted_device(disk).endswith(d.name))
    (device / "trigger_fs_error").write_text("test: turn read-only")
    with pytest.raises(OSError):
        (disk / "probe").write_text("refused")


def _mounted_device(mount: Path) -> str:
    for line in Path("/proc/mounts").read_text().splitlines():
        device, where, *_ = line.split()
        if where == str(mount):
            return device
    raise AssertionError(f"{mount} is not mounted")


def test_a_disk_gone_read_only_is_a_503_and_reads_still_work(make_proxy, upstream, ext4_disk):
    """A disk gone read-only under the open store: said by the first turn that writes, every
    later one refused before anything is forwarded, and what is stored is still read."""
    proxy = make_proxy(data_dir=ext4_disk / "data")
    http = httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth)
    assert turn(http, "ro", "before").status_code == 200
    kept = live(http, "ro")
    forwarded = len(upstream.chat_requests())
    turn_read_only(ext4_disk)
    # Nothing has written since: the turn's items wait for its end (issue 31), which finds the
    # disk read-only; the reply, paid for, still goes to the client, saying it was not kept.
    answered = turn(http, "ro", "while read-only")
    assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"], answered.text
    assert answered.headers["X-Context-Store-Error"] == "The conversation store is read-only: nothing was stored."
    # From then on the store knows: a turn is refused before anything is forwarded.
    forwarded = len(upstream.chat_requests())
    refused = turn(http, "ro", "while read-only")
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "store_read_only"
    assert len(upstream.chat_requests()) == forwarded
    status, body = health(http)
    assert status == 503 and body["store"]["status"] == "read_only", body
    assert live(http, "ro") == kept
    assert http.get("/v1/conversations").status_code == 200


def test_a_store_that_cannot_be_opened_stops_start_up_with_one_line(tmp_path, ext4_disk):
    """A read-only store can't even be opened (SQLite's WAL needs to write its index file)."""
    turn_read_only(ext4_disk)
    config = tmp_path / "config.yaml"
    config.write_text(f"storage: {{path: {ext4_disk / 'data'}}}\n")
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", "0"],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("context-proxy: storage.path: cannot open the store")


def test_store_files_are_private(make_proxy, tmp_path):
    """Issue 12: the store's folder and files were world-readable: transcripts, and the ref
    secret with which refs can be forged. A store made before is made private at start."""
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    (data / "old-file").write_text("from before")
    os.chmod(data / "old-file", 0o644)
    proxy = make_proxy(data_dir=data)
    http = httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth)
    body = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "user", "content": "cat it"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "cat", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "x" * 5_000_000},
        ],
    }
    assert http.post("/v1/chat/completions", json=body, headers=AUTH).status_code == 200
    modes = {}
    for folder, dirs, files in os.walk(data):
        for name in dirs:
            modes[os.path.join(folder, name)] = stat.S_IMODE(os.stat(os.path.join(folder, name)).st_mode)
        for name in files:
            modes[os.path.join(folder, name)] = stat.S_IMODE(os.stat(os.path.join(folder, name)).st_mode)
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
    assert any(path.endswith("cache.db") for path in modes), "no database was written"
    wrong = {path: oct(mode) for path, mode in modes.items() if mode not in (0o600, 0o700)}
    assert wrong == {}


def test_turns_a_sigkill_cut_short_are_marked_failed_at_start(processes, upstream):
    """Issue 12: turns cut by a SIGKILL stayed `pending` in the trajectory forever. Issue 31: a
    turn's new items are durable before its reply's first byte, not before it is forwarded; so a
    turn cut while its upstream still thinks leaves nothing (its client got nothing, and sends it
    again), and one cut mid-stream is marked failed at the next start."""
    (first,) = processes()
    http = httpx.Client(base_url=f"http://127.0.0.1:{first.port}", auth=first.admin_auth, timeout=30)
    for cid in ("thinking", "streaming"):
        assert turn(http, cid, "the task").status_code == 200
    transcript = [
        {"role": "user", "content": "the task"},
        {"role": "assistant", "content": "reply to: the task"},
        {"role": "user", "content": "never answered"},
    ]
    hang = Reply.hang()
    upstream.enqueue(hang)

    def ask(cid: str, stream: bool, first_byte: threading.Event | None = None, hold: threading.Event | None = None) -> None:
        with contextlib.suppress(httpx.HTTPError), httpx.Client(base_url=http.base_url, timeout=30) as other:
            body = {"model": "gpt-4o-mini", "messages": transcript, "stream": stream}
            with other.stream("POST", "/v1/chat/completions", json=body, headers={**AUTH, "X-Conversation-ID": cid}) as r:
                for _ in r.iter_bytes():
                    if first_byte is not None:
                        first_byte.set()
                        hold.wait(30)  # the client stays: the turn is cut by the kill, not by it
                        return

    threading.Thread(target=ask, args=("thinking", False), daemon=True).start()
    assert hang.reached.wait(10)  # forwarded: its new message staged, read as pending
    statuses = [m["status"] for m in http.get("/v1/conversations/thinking/trajectory").json()["data"]]
    assert statuses == ["live", "live", "pending"]
    paused, first_byte, hold = Reply.text("a long answer", pause_after_chunks=2), threading.Event(), threading.Event()
    upstream.enqueue(paused)
    threading.Thread(target=ask, args=("streaming", True, first_byte, hold), daemon=True).start()
    assert first_byte.wait(10)  # its client has the reply's first bytes: its new message is durable
    kill_process(first)
    hang.release()
    paused.release()
    hold.set()
    (second,) = processes()
    with httpx.Client(base_url=f"http://127.0.0.1:{second.port}", auth=second.admin_auth, timeout=30) as http2:
        statuses = [m["status"] for m in http2.get("/v1/conversations/thinking/trajectory").json()["data"]]
        assert statuses == ["live", "live"]
        statuses = [m["status"] for m in http2.get("/v1/conversations/streaming/trajectory").json()["data"]]
        assert statuses == ["live", "live", "failed"]
        assert [m["content"] for m in live(http2, "streaming")] == ["the task", "reply to: the task"]
    assert "interrupted turns marked failed" in second.log_path.read_text()


def test_a_streamed_turn_goes_upstream_before_its_commit(processes, upstream, tmp_path):
    """Issue 31: a streamed turn's new items must be durable before its reply's first byte, not
    before it is forwarded: the commit runs while the upstream works. It ran first, holding the
    request back by its whole length. With the store's database write-locked by another
    connection, so that the commit must wait, the request still reaches the upstream; once the
    lock goes, the reply streams and the turn is kept."""
    (proxy,) = processes()
    http = httpx.Client(base_url=f"http://127.0.0.1:{proxy.port}", auth=proxy.admin_auth, timeout=30)
    assert turn(http, "overlap", "the task").status_code == 200  # its record is in memory: the next turn stages
    answer = Reply.text("the streamed answer", pause_after_chunks=0)
    upstream.enqueue(answer)
    stored = [{"role": m["role"], "content": m["content"]} for m in live(http, "overlap")]
    transcript = [*stored, {"role": "user", "content": "go on"}]
    received: list[bytes] = []

    def ask() -> None:
        body = {"model": "gpt-4o-mini", "messages": transcript, "stream": True}
        with httpx.Client(base_url=http.base_url, timeout=60) as client, client.stream(
            "POST", "/v1/chat/completions", json=body, headers={**AUTH, "X-Conversation-ID": "overlap"}
        ) as r:
            received.append(b"".join(r.iter_bytes()))

    lock = sqlite3.connect(tmp_path / "data" / "cache.db", isolation_level=None, timeout=30)
    asking = threading.Thread(target=ask, daemon=True)
    try:
        lock.execute("BEGIN IMMEDIATE")  # no other connection commits until it ends
        asking.start()
        assert answer.reached.wait(10), "the request waited for its commit"
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    answer.release()
    asking.join(30)
    assert received and b"the streamed answer" not in received[0]  # sent in 4-character deltas
    assert "".join(re.findall(r'"content":"([^"]*)"', received[0].decode())) == "the streamed answer"
    kept = [m["content"] for m in live(http, "overlap")]
    assert kept == ["the task", "reply to: the task", "go on", "the streamed answer"]


def test_redis_out_of_memory_is_a_507_and_delete_still_works(make_proxy, upstream, redis):
    proxy = make_proxy(storage={"backend": "redis", "redis_url": redis.url})
    http = httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth)
    for cid in ("keep", "drop"):
        assert turn(http, cid, cid).status_code == 200
    kept = live(http, "keep")
    forwarded = len(upstream.chat_requests())
    admin = redis_sync.Redis.from_url(redis.url)
    admin.config_set("maxmemory", "1")  # every write that needs memory is refused (noeviction)
    try:
        refused = turn(http, "keep", "more")
        assert refused.status_code == 507 and refused.json()["error"]["code"] == "store_full", refused.text
        assert len(upstream.chat_requests()) == forwarded
        status, body = health(http)
        assert status == 503 and body["store"]["status"] == "full", body
        assert http.delete("/v1/conversations/drop").status_code == 200
        assert http.get("/v1/conversations/drop").status_code == 404
        assert live(http, "keep") == kept
    finally:
        admin.config_set("maxmemory", "0")
    wait_until(lambda: health(http)[0] == 200, what="/healthz ok again")
    assert turn(http, "keep", "more").status_code == 200
