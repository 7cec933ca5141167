"""The OpenAI Agents SDK on its default model (`OpenAIResponsesModel`: the Responses API) in tests:
one agent with one tool, run through a base URL we give it."""

from __future__ import annotations

from tests.conftest import ALICE


def run_tests_agent(base_url: str, model: str, conversation_id: str) -> tuple[str, list[str]]:
    """Run an agent told to run the tests, whose one tool `run_tests(path)` answers
    "<path>: 12 passed"; returns its final output and the paths the tool was called with. What the
    model says is the test's to script at the upstream."""
    from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    ran: list[str] = []

    @function_tool
    def run_tests(path: str) -> str:
        """Run the tests under a path."""
        ran.append(path)
        return f"{path}: 12 passed"

    client = AsyncOpenAI(
        base_url=base_url, api_key=ALICE, max_retries=0, default_headers={"X-Conversation-ID": conversation_id}
    )
    agent = Agent(
        name="tester",
        instructions="Run the tests.",
        tools=[run_tests],
        model=OpenAIResponsesModel(model=model, openai_client=client),
    )
    result = Runner.run_sync(agent, "run the tests", run_config=RunConfig(tracing_disabled=True))
    return str(result.final_output), ran
