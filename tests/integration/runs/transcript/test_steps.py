"""A run's transcript through the public API: steps as the loop wrote them, the token split, who
sees the contents, and the failure paths keeping their steps."""

from __future__ import annotations

import dramatiq

from agent_engine.db.platform import ITERATION_CAP
from agent_engine.testing.fake_openai import (
    FakeOpenAIServer,
    FakeToolCall,
    error_reply,
    text_reply,
    tool_reply,
)
from tests.integration.runs.support import FakeAgent
from tests.integration.runs.transcript.support import START, Gql
from tests.support.factories import Factories


async def test_a_run_with_a_tool_call_shows_its_steps_and_token_split(
    gql: Gql,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent = await fake_agent()
    owner = int(agent["user_id"])
    admin = (await factories.user())["id"]
    fake_openai.enqueue(
        tool_reply(
            FakeToolCall("search_knowledge", {"query": "vpn rotation"}),
            content="Let me look that up.",
            prompt_tokens=100,
            completion_tokens=7,
        ),
        text_reply("Nothing about VPN rotation yet.", prompt_tokens=150, completion_tokens=20),
    )

    started = await gql.data(START, {"id": str(agent["id"])}, as_user=owner)
    run = await gql.finished_run(started["startRun"]["id"], as_user=owner)

    assert run["state"] == "SUCCEEDED"
    assert (run["promptTokens"], run["completionTokens"], run["tokensUsed"]) == (250, 27, 277)
    steps = run["steps"]
    assert [(s["index"], s["kind"], s["name"]) for s in steps] == [
        (0, "MODEL_CALL", "fake-model"),
        (1, "TOOL_CALL", "search_knowledge"),
        (2, "MODEL_CALL", "fake-model"),
    ]
    assert [(s["promptTokens"], s["completionTokens"]) for s in steps] == [
        (100, 7),
        (None, None),
        (150, 20),
    ]
    assert sum(s["promptTokens"] or 0 for s in steps) == run["promptTokens"]
    assert steps[0]["output"] == "Let me look that up."
    assert steps[1]["input"] == {"query": "vpn rotation"}
    # The tool step keeps the result exactly as the model saw it.
    seen_by_model = [m for m in fake_openai.requests[1]["messages"] if m["role"] == "tool"]
    assert steps[1]["output"] == seen_by_model[0]["content"]
    assert steps[1]["error"] is None
    assert steps[2]["output"] == "Nothing about VPN rotation yet."
    assert all(s["finishedAt"] is not None and s["finishedAt"] >= s["startedAt"] for s in steps)

    # The admin sees what happened, not what was read with the owner's access.
    seen_by_admin = await gql.run(run["id"], as_user=admin, admin=True)
    assert [(s["kind"], s["name"], s["promptTokens"]) for s in seen_by_admin["steps"]] == [
        (s["kind"], s["name"], s["promptTokens"]) for s in steps
    ]
    assert all(s["input"] is None and s["output"] is None for s in seen_by_admin["steps"])


async def test_the_iteration_cap_and_a_provider_error_keep_their_steps(
    gql: Gql,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    await factories.setting(ITERATION_CAP, 2)
    capped = await fake_agent()
    fake_openai.enqueue(
        tool_reply(FakeToolCall("search_knowledge", {"query": "a"})),
        tool_reply(FakeToolCall("search_knowledge", {"query": "b"})),
    )
    started = await gql.data(START, {"id": str(capped["id"])}, as_user=int(capped["user_id"]))
    run = await gql.finished_run(started["startRun"]["id"], as_user=int(capped["user_id"]))
    assert (run["state"], run["reason"]) == ("FAILED", "ITERATION_CAP")
    assert [s["kind"] for s in run["steps"]] == ["MODEL_CALL", "TOOL_CALL", "MODEL_CALL"]
    assert run["tokensUsed"] == run["promptTokens"] + run["completionTokens"] == 30

    broken = await fake_agent()
    fake_openai.enqueue(error_reply(400, "the model does not exist"))
    started = await gql.data(START, {"id": str(broken["id"])}, as_user=int(broken["user_id"]))
    run = await gql.finished_run(started["startRun"]["id"], as_user=int(broken["user_id"]))
    assert (run["state"], run["reason"]) == ("FAILED", "ERROR")
    (step,) = run["steps"]
    assert step["kind"] == "MODEL_CALL" and step["finishedAt"] is not None
    assert step["error"] == "model 'Fake' failed: the provider refused the request (HTTP 400)"
    assert step["error"] == run["error"]


async def test_a_tool_refusal_is_a_step_error_the_model_saw(
    gql: Gql,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent = await fake_agent()
    fake_openai.enqueue(tool_reply(FakeToolCall("no_such_tool", "{not json")), text_reply("Sorry."))
    started = await gql.data(START, {"id": str(agent["id"])}, as_user=int(agent["user_id"]))
    run = await gql.finished_run(started["startRun"]["id"], as_user=int(agent["user_id"]))
    tool = run["steps"][1]
    assert (tool["kind"], tool["name"], tool["input"]) == ("TOOL_CALL", "no_such_tool", "{not json")
    assert tool["error"].startswith("unknown tool 'no_such_tool'")
    assert tool["output"] == "error: " + tool["error"]
