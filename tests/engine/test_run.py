"""One way through a turn (proxy/engine): `Engine.run(TurnRequest, sink)` takes a request's bytes
and headers, no HTTP handler in between, and reads the body, finds the conversation and makes
the report itself; the agent's upstream calls go through upstreams the router hands out tracked
by the engine's InFlight."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.dialects.chat import CHAT
from proxy.engine import TurnReport, TurnRequest
from proxy.errors import InvalidRequest
from proxy.identity import ConversationKey, tenant_of
from proxy.state import ENGINE, METRICS
from tests.conftest import ALICE, admin_get, live_messages, openai_client
from tests.fakes.fake_upstream import Reply

TENANT = tenant_of(ALICE)
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello"}]


class Sink:
    """A client connection as the engine sees it: what it was told and sent."""

    def __init__(self) -> None:
        self.reports: list[TurnReport] = []
        self.status: int | None = None
        self.data = b""
        self.closed = False

    def began(self, report: TurnReport) -> None:
        self.reports.append(report)

    async def open(self, status: int, headers: Mapping[str, str]) -> None:
        self.status = status

    async def write(self, data: bytes) -> None:
        self.data += data

    async def close(self) -> None:
        self.closed = True


def request(raw: bytes, **headers: str) -> TurnRequest:
    headers = {"Authorization": f"Bearer {ALICE}", **headers}
    return TurnRequest(
        dialect=CHAT, raw=raw, headers=CIMultiDictProxy(CIMultiDict(headers)), tenant=TENANT, conversation_id="engine-run"
    )


def sample(metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_runs_from_its_bytes_with_no_http_handler(proxy, upstream, servers, http, stream: bool) -> None:
    engine, metrics = proxy.app[ENGINE], proxy.app[METRICS]
    upstream.enqueue(Reply.text("hi there"))
    sink = Sink()
    body = orjson.dumps({"model": "m", "messages": MESSAGES, "stream": stream})
    outcome = servers.run(engine.run(request(body, **{"User-Agent": "OpenAI/Python 1.99.1"}), sink))
    servers.run(engine.idle())

    # The sink was told of the turn's report once its conversation was known; the report says
    # how the turn went (its first: no previous turn to build on) and names the client.
    [report] = sink.reports
    assert report.key == ConversationKey(TENANT, "engine-run") and outcome.report is report
    assert report.client == "OpenAI Python SDK 1.99.1"
    assert (report.fast_path, report.fast_path_reason) == ("none", "no_previous_turn")
    if stream:
        assert outcome.body is None and sink.status == 200 and sink.closed
        assert b'"hi t"' in sink.data and sink.data.rstrip().endswith(b"data: [DONE]")  # relayed as it came
    else:
        assert orjson.loads(outcome.body)["choices"][0]["message"]["content"] == "hi there"
        assert sink.status is None  # nothing streamed
    stored = live_messages(http, "engine-run", ALICE)
    assert [m["content"] for m in stored] == ["You are terse.", "hello", "hi there"]
    # The engine measured the turn (the handler no longer does).
    assert sample(metrics, "context_proxy_fast_path_not_taken_turns_total", reason="no_previous_turn") == 1
    assert sample(metrics, "context_proxy_added_seconds_count") == 1


def test_a_body_that_is_no_json_is_refused_before_any_conversation_is_known(proxy, servers, http) -> None:
    sink = Sink()
    with pytest.raises(InvalidRequest) as refused:
        servers.run(proxy.app[ENGINE].run(request(b'{"model": "m", "messages": ['), sink))
    assert refused.value.code == "invalid_json"
    assert sink.reports == []  # no conversation, no report
    assert admin_get(http, "/engine-run", ALICE).status_code == 404  # nothing stored


def test_the_agents_upstream_is_in_flight_until_its_reply_is_closed(proxy, upstream) -> None:
    engine = proxy.app[ENGINE]
    router, inflight = engine.router, engine.inflight
    assert proxy.app[ENGINE].summarizer.inflight is inflight  # the summaries yield to the engine's
    assert router.for_agent("m") is router.for_agent("m") and router.for_agent("m").upstream is router.for_model("m")
    slow = Reply.text("slow answer", pause_after_chunks=1)
    upstream.enqueue(slow)
    client = openai_client(proxy, headers={"X-Conversation-ID": "in-flight-upstream"})

    def ask() -> str:
        chunks = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    assert not inflight.busy(router.for_model("m"))
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(ask)
        assert slow.reached.wait(10)  # the reply is under way, held after its first chunk
        assert inflight.busy(router.for_model("m"))
        slow.release()
        assert answer.result(timeout=30) == "slow answer"
    assert not inflight.busy(router.for_model("m"))
