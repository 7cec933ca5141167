"""The proxy as a real process: restarts, its logs, the CLI, and the Docker image's steps."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.conftest import openai_client
from tests.fakes.fake_upstream import Reply
from tests.support.harness import ROOT, ProxyProcess

SECRET_KEY = "sk-live-do-not-leak-7f3a9c2e1b"


def write_config(tmp_path: Path, upstream_url: str, **extra: dict) -> Path:
    config = {
        "upstream": {"base_url": upstream_url, "timeout_s": 30},
        "storage": {"path": str(tmp_path / "data")},
        "logging": {"level": "DEBUG"},
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def process(tmp_path, upstream):
    started: list[ProxyProcess] = []

    def start(**extra: dict) -> ProxyProcess:
        p = ProxyProcess(write_config(tmp_path, upstream.base_url, **extra), tmp_path / "proxy.log").start()
        started.append(p)
        return p

    yield start
    for p in started:
        if p.proc and p.proc.poll() is None:
            p.stop()


def test_conversations_continue_after_a_restart(process, upstream, tmp_path):
    first = process()
    full = openai_client(first, headers={"X-Conversation-ID": "survivor"})
    transcript = [{"role": "system", "content": "s"}, {"role": "user", "content": "before restart"}]
    transcript.append(full.chat.completions.create(model="m", messages=transcript).choices[0].message.model_dump(exclude_none=True))
    proxy_mode = openai_client(first, headers={"X-Conversation-ID": "ph", "X-History": "proxy"})
    proxy_mode.chat.completions.create(model="m", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "one"}])
    assert first.stop() == 0

    second = process()
    full = openai_client(second, headers={"X-Conversation-ID": "survivor"})
    transcript.append({"role": "user", "content": "after restart"})
    full.chat.completions.create(model="m", messages=transcript)
    proxy_mode = openai_client(second, headers={"X-Conversation-ID": "ph", "X-History": "proxy"})
    proxy_mode.chat.completions.create(model="m", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "two"}])
    assert upstream.chat_requests()[-1]["messages"] == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "reply to: one"},
        {"role": "user", "content": "two"},
    ]
    with httpx.Client(base_url=f"http://127.0.0.1:{second.port}", auth=second.admin_auth) as http:
        stored = http.get("/v1/conversations/survivor/trajectory").json()["data"]
    assert [m["content"] for m in stored] == ["s", "before restart", "reply to: before restart", "after restart", "reply to: after restart"]
    assert all(m["status"] == "live" for m in stored)


def test_api_key_is_nowhere_on_disk_nor_in_the_logs(process, upstream, tmp_path):
    proc = process()
    client = openai_client(proc, SECRET_KEY, headers={"X-Conversation-ID": "keyed"})
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
    upstream.enqueue(Reply.error(401, {"error": {"message": "bad key", "type": "auth", "code": "invalid_api_key"}}))
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
    client.models.list()
    with httpx.Client(base_url=f"http://127.0.0.1:{proc.port}", auth=proc.admin_auth) as http:
        assert http.get("/v1/conversations", headers={"Authorization": f"Bearer {SECRET_KEY}"}).status_code == 200
        assert http.post("/v1/chat/completions", content=b"{", headers={"Authorization": f"Bearer {SECRET_KEY}", "Content-Type": "application/json"}).status_code == 400
    assert proc.stop() == 0

    files = [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert files, "the store wrote nothing: this test would prove nothing"
    needle = SECRET_KEY.encode()
    for path in files + [tmp_path / "proxy.log"]:
        assert needle not in path.read_bytes(), f"API key found in {path}"
    # Every line is JSON but the /ui URL printed at start-up (the admin token, meant to be read there).
    log_lines = [json.loads(line) for line in (tmp_path / "proxy.log").read_text().splitlines() if not line.startswith("context-proxy: open ")]
    assert sum(1 for e in log_lines if e.get("msg") == "request") >= 5  # the traffic was logged, without the key


def dockerfile() -> dict[str, list[str]]:
    """Dockerfile instructions by keyword (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.setdefault(word.upper(), []).append(rest.strip())
    return out


def test_the_store_threads_wait_for_the_event_loops_core_and_the_loop_does_not(process):
    """The diskcache store's thread and its checkpointer run under SCHED_BATCH (no preemption of
    the loop when it wakes them); the event loop's thread and the executor's keep the default."""
    proc = process()
    client = openai_client(proc, headers={"X-Conversation-ID": "threads"})
    # A model tiktoken knows: its tokenizer is loaded in an executor thread, which then exists.
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}])
    assert proc.proc is not None
    pid = proc.proc.pid
    policies = {int(tid): os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}
    assert policies.pop(pid) == os.SCHED_OTHER  # the event loop's
    assert len(policies) >= 3  # the store's thread, the checkpointer, at least one executor thread
    assert sorted(policies.values()).count(os.SCHED_BATCH) == 2
    assert set(policies.values()) == {os.SCHED_BATCH, os.SCHED_OTHER}


def test_dockerfile_installs_like_make_and_runs_as_non_root():
    steps = dockerfile()
    assert any("scripts/install.sh" in run for run in steps["RUN"])
    assert "scripts/install.sh $(VENV)" in (ROOT / "Makefile").read_text()
    assert steps["USER"] == ["proxy"] and "useradd" in " ".join(steps["RUN"])


def test_dockerfile_cmd_serves_and_its_healthcheck_passes(tmp_path, upstream):
    steps = dockerfile()
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(steps["ENV"])))
    env.pop("PATH")  # the image's venv: here, the test's own interpreter stands in for it
    env.update(
        CONTEXT_PROXY_SERVER__HOST="127.0.0.1",  # the image binds 0.0.0.0; tests stay on loopback
        CONTEXT_PROXY_SERVER__PORT="0",
        CONTEXT_PROXY_STORAGE__PATH=str(tmp_path / "data"),
        CONTEXT_PROXY_UPSTREAM__BASE_URL=upstream.base_url,
    )
    cmd = json.loads(steps["CMD"][0])
    assert cmd[:2] == ["context-proxy", "serve"]
    cmd[0] = str(Path(sys.executable).parent / cmd[0])  # the console script this venv's install made
    proc = ProxyProcess(ROOT / "config.yaml", tmp_path / "docker.log", env, argv=cmd).start()
    try:
        health = shlex.split(steps["HEALTHCHECK"][0].split("CMD", 1)[1].strip().strip("[]").replace(",", " "))
        health = [sys.executable if part.strip('"') == "python" else part.strip('"') for part in health]
        result = subprocess.run(health, env={**os.environ, "CONTEXT_PROXY_SERVER__PORT": str(proc.port)}, timeout=30)
        assert result.returncode == 0
    finally:
        proc.stop()
    # And it reports unhealthy once the proxy is gone.
    result = subprocess.run(health, env={**os.environ, "CONTEXT_PROXY_SERVER__PORT": str(proc.port)}, capture_output=True, timeout=30)
    assert result.returncode == 1
