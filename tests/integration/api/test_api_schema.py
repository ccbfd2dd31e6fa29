"""The exported SDL matches the code, and the code covers the contract."""

from __future__ import annotations

from pathlib import Path

from graphql import (
    GraphQLEnumType,
    GraphQLInputObjectType,
    GraphQLInterfaceType,
    GraphQLObjectType,
    GraphQLSchema,
    GraphQLUnionType,
    build_schema,
)

from agent_engine.api.schema import export_sdl

ROOT = Path(__file__).resolve().parents[3]
COMMITTED_SDL = ROOT / "schema" / "schema.graphql"
# A copy of ../shared/api/schema.graphql, so the test does not depend on a sibling checkout.
CONTRACT = Path(__file__).with_name("contract.graphql")


def test_committed_sdl_matches_the_code() -> None:
    assert COMMITTED_SDL.read_text() == export_sdl(), (
        "schema/schema.graphql is stale: run `agent-engine export-schema`"
    )


def _missing(contract: GraphQLSchema, ours: GraphQLSchema) -> list[str]:
    missing: list[str] = []
    for name, expected in contract.type_map.items():
        if name.startswith("__"):
            continue
        actual = ours.type_map.get(name)
        if actual is None:
            missing.append(f"type {name}")
            continue
        if type(actual) is not type(expected):
            missing.append(f"type {name}: {type(actual).__name__}")
            continue
        if isinstance(expected, GraphQLEnumType):
            assert isinstance(actual, GraphQLEnumType)
            missing += [f"{name}.{v}" for v in expected.values if v not in actual.values]
        if isinstance(expected, GraphQLUnionType):
            assert isinstance(actual, GraphQLUnionType)
            if {t.name for t in expected.types} != {t.name for t in actual.types}:
                missing.append(f"union {name} members")
        if isinstance(expected, GraphQLInputObjectType):
            assert isinstance(actual, GraphQLInputObjectType)
            if expected.is_one_of != actual.is_one_of:
                missing.append(f"{name} @oneOf")
            for field, definition in expected.fields.items():
                ours_field = actual.fields.get(field)
                if ours_field is None or str(ours_field.type) != str(definition.type):
                    missing.append(f"{name}.{field}: {definition.type}")
                elif ours_field.default_value != definition.default_value:
                    missing.append(f"{name}.{field} default")
        if isinstance(expected, GraphQLObjectType | GraphQLInterfaceType):
            assert isinstance(actual, GraphQLObjectType | GraphQLInterfaceType)
            for field, definition in expected.fields.items():
                ours_field = actual.fields.get(field)
                if ours_field is None or str(ours_field.type) != str(definition.type):
                    missing.append(f"{name}.{field}: {definition.type}")
                    continue
                for arg, arg_def in definition.args.items():
                    ours_arg = ours_field.args.get(arg)
                    if ours_arg is None or str(ours_arg.type) != str(arg_def.type):
                        missing.append(f"{name}.{field}({arg}: {arg_def.type})")
                    elif ours_arg.default_value != arg_def.default_value:
                        missing.append(f"{name}.{field}({arg}) default")
    return missing


def test_every_type_field_and_argument_of_the_contract_exists() -> None:
    contract = build_schema(CONTRACT.read_text())
    ours = build_schema(export_sdl())
    missing = _missing(contract, ours)
    assert not missing, missing


def test_the_subscription_type_is_served() -> None:
    ours = build_schema(export_sdl())
    assert ours.subscription_type is not None
    assert set(ours.subscription_type.fields) == {
        "runEvents",
        "budget",
        "budgetAlerts",
        "runSteps",
        "toolApprovals",
    }


# The types and fields of cost, forecast, alerts, spend), named so that a contract copy
# that lost them fails here too.
SPEND_PARTS = {
    "Decimal": None,
    "AgentModel": {"inputPricePerMillion", "outputPricePerMillion"},
    "Agent": {"expectedTokensPerRun"},
    "Run": {"promptTokens", "completionTokens", "cost"},
    "Budget": {"usedCost", "forecast"},
    "BudgetForecast": None,
    "OwnerSpend": None,
    "BudgetAlert": None,
    "Viewer": {"budgetAlerts"},
    "PlatformSettings": {"currency", "budgetAlertPercents"},
    "PlatformSettingsInput": {"currency", "budgetAlertPercents"},
    "AgentModelInput": {"inputPricePerMillion", "outputPricePerMillion"},
    "Query": {"adminBudgetAlerts", "adminSpend"},
    "Subscription": {"budgetAlerts"},
}


def test_the_spend_parts_of_the_turn2_contract_exist() -> None:
    contract = build_schema(CONTRACT.read_text())
    ours = build_schema(export_sdl())
    missing = _missing(contract, ours)

    def field_of(entry: str, type_name: str) -> str:
        return entry[len(type_name) + 1 :].split("(")[0].split(":")[0]

    ours_missing = [
        entry
        for entry in missing
        for type_name, fields in SPEND_PARTS.items()
        if entry == f"type {type_name}"
        or (
            entry.startswith(f"{type_name}.")
            and (fields is None or field_of(entry, type_name) in fields)
        )
    ]
    assert not ours_missing, ours_missing
    # The check itself finds what it looks for: the contract has every one of these parts.
    for type_name, fields in SPEND_PARTS.items():
        assert type_name in contract.type_map
        if fields is not None:
            defined = contract.type_map[type_name].fields  # type: ignore[union-attr]
            assert fields <= set(defined), (type_name, fields - set(defined))
