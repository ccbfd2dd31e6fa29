"""A run's cost: the provider's token split priced at the model's prices when the run finished."""

from __future__ import annotations

import dramatiq
import pytest

from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from tests.integration.runs.spend.support import (
    ADMIN_ID,
    UPSERT_MODEL,
    create_agent,
    fake_model,
    model_input,
    run_to_the_end,
)
from tests.integration.runs.transcript.support import Gql

OWNER = 7
BUDGET_COST = "{ viewer { budget { usedTokens usedCost } } }"
MODELS = "{ agentModels { id inputPricePerMillion outputPricePerMillion } }"
MODELS_WITH_NAMES = "{ agentModels { id name inputPricePerMillion outputPricePerMillion } }"


async def test_a_run_costs_its_token_split_at_the_prices_of_its_finish(
    gql: Gql, fake_openai: FakeOpenAIServer, worker: dramatiq.Worker
) -> None:
    model = await fake_model(
        gql, fake_openai.base_url, inputPricePerMillion="1.5", outputPricePerMillion="6"
    )
    agent = await create_agent(gql, OWNER, model)
    fake_openai.enqueue(text_reply("Two changes.", prompt_tokens=7, completion_tokens=3))

    first = await run_to_the_end(gql, OWNER, agent)

    assert first["state"] == "SUCCEEDED"
    assert (first["promptTokens"], first["completionTokens"], first["tokensUsed"]) == (7, 3, 10)
    # 7 x 1.5 / 1M + 3 x 6 / 1M, exactly.
    assert first["cost"] == "0.0000285"

    # The admin raises the input price: the finished run keeps its cost, the next one pays more.
    changed = {"id": model, "inputPricePerMillion": "100"}
    await gql.data(
        UPSERT_MODEL,
        {"input": model_input(fake_openai.base_url, **changed)},
        as_user=ADMIN_ID,
        admin=True,
    )
    fake_openai.enqueue(text_reply("One change.", prompt_tokens=7, completion_tokens=3))
    second = await run_to_the_end(gql, OWNER, agent)

    again = await gql.finished_run(first["id"], as_user=OWNER)
    assert again["cost"] == "0.0000285"
    assert second["cost"] == "0.000718"  # 7 x 100 + 3 x 6 (the output price was left unchanged)
    budget = (await gql.data(BUDGET_COST, as_user=OWNER))["viewer"]["budget"]
    assert budget == {"usedTokens": 20, "usedCost": "0.0007465"}


async def test_an_unpriced_model_gives_no_cost_and_an_explicit_null_unprices(
    gql: Gql, fake_openai: FakeOpenAIServer, worker: dramatiq.Worker
) -> None:
    unpriced = await fake_model(gql, fake_openai.base_url)
    priced = await fake_model(
        gql, fake_openai.base_url, inputPricePerMillion="2", outputPricePerMillion="2"
    )
    budget = (await gql.data(BUDGET_COST, as_user=OWNER))["viewer"]["budget"]
    assert budget == {"usedTokens": 0, "usedCost": None}

    run = await run_to_the_end(gql, OWNER, await create_agent(gql, OWNER, unpriced))
    assert run["state"] == "SUCCEEDED" and run["tokensUsed"] == 15 and run["cost"] is None
    budget = (await gql.data(BUDGET_COST, as_user=OWNER))["viewer"]["budget"]
    assert budget == {"usedTokens": 15, "usedCost": None}

    # Absent prices stay; an explicit null removes one, and half a price list prices nothing.
    unpricing = {"id": priced, "outputPricePerMillion": None}
    await gql.data(
        UPSERT_MODEL,
        {"input": model_input(fake_openai.base_url, **unpricing)},
        as_user=ADMIN_ID,
        admin=True,
    )
    models = {m["id"]: m for m in (await gql.data(MODELS, as_user=OWNER))["agentModels"]}
    assert models[priced] == {
        "id": priced,
        "inputPricePerMillion": "2",
        "outputPricePerMillion": None,
    }
    run = await run_to_the_end(gql, OWNER, await create_agent(gql, OWNER, priced))
    assert run["tokensUsed"] == 15 and run["cost"] is None


@pytest.mark.parametrize(
    ("prices", "field"),
    [
        ({"inputPricePerMillion": "-0.5"}, "input.inputPricePerMillion"),
        ({"outputPricePerMillion": "10000.01"}, "input.outputPricePerMillion"),
        ({"inputPricePerMillion": "cheap"}, "input.inputPricePerMillion"),
        ({"outputPricePerMillion": "NaN"}, "input.outputPricePerMillion"),
    ],
)
async def test_a_bad_price_is_refused_naming_the_field_and_changes_nothing(
    gql: Gql, fake_openai: FakeOpenAIServer, prices: dict[str, str], field: str
) -> None:
    model = await fake_model(
        gql, fake_openai.base_url, inputPricePerMillion="1", outputPricePerMillion="1"
    )
    changes = {"id": model, "name": "Renamed", **prices}
    body = await gql.body(
        UPSERT_MODEL, {"input": model_input(fake_openai.base_url, **changes)}, as_user=1, admin=True
    )
    (error,) = body["errors"]
    assert error["extensions"] == {"code": "BAD_USER_INPUT", "field": field}
    models = (await gql.data(MODELS_WITH_NAMES, as_user=OWNER))["agentModels"]
    assert models == [
        {"id": model, "name": "Fake", "inputPricePerMillion": "1", "outputPricePerMillion": "1"}
    ]
