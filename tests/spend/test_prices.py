"""Prices, costs and the config checks of the price table and budgets."""

from __future__ import annotations

import pytest

from prefixgate.config import ConfigError, parse_config
from prefixgate.record import Record
from prefixgate.spend.budgets import BudgetSyntaxError, parse_budget, window
from prefixgate.spend.prices import NANOS, Price, PriceTable, fmt_money, micros

CH = {"name": "gpu", "base_url": "http://127.0.0.1:9/v1", "models": ["qwen3", "llm-prime"]}


def table(**over) -> PriceTable:
    return PriceTable(
        "USD",
        {"qwen3": Price.of(0.60, 0.06, 2.40), **over.get("models", {})},
        over.get("channels", {}),
    )


def test_cost_splits_fresh_cached_and_writes_exactly():
    p = Price.of(3.00, 0.30, 15.00, cache_write=3.75)
    # 1M fresh + 1M cached + 1M written + 1M output = 3 + 0.3 + 3.75 + 15 dollars
    assert p.cost(1_000_000, 1_000_000, 1_000_000, 1_000_000) == 22_050_000_000
    # one token of cached input at $0.30/M is 0.3 micro-dollars: 300 nanos, exactly
    assert p.cost(0, 1, 0, 0) == 300
    assert p.saved(1_000_000) == int(2.70 * NANOS)
    assert micros("0.0375") == 37_500 and micros(0.1) == 100_000  # no float drift


def test_a_record_is_charged_from_its_raw_usage():
    rec = Record(request_id="r", received_at=0.0, requested_model="qwen3", channel="gpu")
    rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens = 10_000, 8_000, 500
    table().charge(rec)
    # 2,000 fresh at 0.60 + 8,000 cached at 0.06 + 500 out at 2.40 (per million)
    assert rec.cost_nano == 2_000 * 600 + 8_000 * 60 + 500 * 2_400
    assert rec.cost_saved_nano == 8_000 * (600 - 60)
    assert fmt_money(rec.cost_nano) == "0.002880"


def test_a_channel_price_wins_and_no_price_is_no_cost():
    t = table(channels={"vendor": Price.of(3, 0.3, 15)})
    assert t.price("qwen3", "vendor").input == micros(3)
    assert t.price("qwen3", "gpu").input == micros(0.6)
    assert t.cost("other", "gpu", 100, 0, 0, 10) is None
    assert t.cost("qwen3", "gpu", None, None, None, None) is None  # no usage reported


def test_budget_lines():
    b = parse_budget("2M tokens/day")
    assert (b.amount, b.unit, b.period, b.money) == (2_000_000, "tokens", "day", False)
    m = parse_budget("12.50 usd/month", "USD")
    assert (m.amount, m.unit, m.money) == (12_500_000_000, "USD", True)
    assert parse_budget("1.5k tokens/week").amount == 1_500
    with pytest.raises(BudgetSyntaxError, match="unknown unit 'coins'"):
        parse_budget("5 coins/day")
    with pytest.raises(BudgetSyntaxError, match="unknown period 'fortnight'"):
        parse_budget("5 tokens/fortnight")
    with pytest.raises(BudgetSyntaxError, match="write it as"):
        parse_budget("lots")
    with pytest.raises(BudgetSyntaxError, match="above zero"):
        parse_budget("0 tokens/day")


def test_windows_are_calendar_utc():
    t = 1_718_900_000.0  # 2024-06-20 (a Thursday) 16:13 UTC
    assert window("day", t) == (1_718_841_600.0, 1_718_928_000.0)
    assert window("week", t)[0] == 1_718_582_400.0  # Monday 2024-06-17
    assert window("month", t) == (1_717_200_000.0, 1_719_792_000.0)  # June
    assert window("month", 1_733_011_200.0)[1] == 1_735_689_600.0  # December ends in January


def _config(**top):
    return parse_config({"channels": [CH], "store": None, **top})


@pytest.mark.parametrize(
    "top, message",
    [
        (
            {"prices": {"models": {"gpt-9": {"input": 1, "cached_input": 0.1, "output": 2}}}},
            "prices.models.gpt-9: no channel serves model 'gpt-9' (served: llm-prime, qwen3)",
        ),
        (
            {"prices": {"models": {"qwen3": {"input": -1, "cached_input": 0, "output": 2}}}},
            "prices.models.qwen3.input: Input should be greater than or equal to 0",
        ),
        (
            {"prices": {"channels": {"nope": {"input": 1, "cached_input": 0.1, "output": 2}}}},
            "prices.channels.nope: no such channel",
        ),
        (
            {"budgets": {"owners": {"team": ["5 coins/day"]}}},
            "budgets.owners.team: budget '5 coins/day': unknown unit 'coins'",
        ),
        (
            {
                "keys": [
                    {"name": "alice", "key_sha256": "0" * 64, "budgets": ["5 tokens/fortnight"]}
                ]
            },
            "keys[alice].budgets: budget '5 tokens/fortnight': unknown period 'fortnight'",
        ),
        (
            {"budgets": {"owners": {"team": ["50 USD/month"]}}},
            "budget '50 USD/month' is money: it needs a price table",
        ),
        ({"budgets": {"shared": "http://x"}}, "budgets.shared: Value error, must be a redis://"),
        ({"telemetry": {"otlp_endpoint": "collector:4318"}}, "otlp_endpoint must be an http"),
        (
            {"prices": {"currency": "US DOLLARS"}},
            "prices.currency: String should match pattern",
        ),
    ],
)
def test_bad_prices_and_budgets_are_config_errors(top, message):
    with pytest.raises(ConfigError) as info:
        _config(**top)
    assert message in str(info.value)


def test_a_channel_that_serves_any_model_accepts_any_price():
    cfg = parse_config(
        {
            "channels": [{"name": "any", "base_url": "http://127.0.0.1:9/v1"}],
            "store": None,
            "prices": {
                "currency": "EUR",
                "models": {"whatever": {"input": 1, "cached_input": 0.1, "output": 2}},
            },
            "budgets": {"owners": {"team": ["50 EUR/month", "1M tokens/day"]}},
        }
    )
    assert cfg.prices.currency == "EUR"
