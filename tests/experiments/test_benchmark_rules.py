"""Pre-registered decision rules of the benchmarks, on stand-in gate verdicts."""

from __future__ import annotations

import sys

from memloop.testing.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import adapter_ab


def verdicts(**by_key: tuple[str, str]) -> dict:
    """{comparison: {"gate": {"verdict": v}}} for each adapter's (seed, hand) verdicts."""
    out = {}
    for adapter, (seed, hand) in by_key.items():
        out[f"seed/{adapter} - seed/json"] = {"gate": {"verdict": seed}}
        out[f"hand/{adapter} - hand/json"] = {"gate": {"verdict": hand}}
    return out


def test_an_adapter_replaces_json_only_when_improved_on_one_prompt_and_not_worse_on_the_other():
    decide = adapter_ab.decide
    chosen = decide(
        verdicts(chat=("improved", "not worse"), xml=("improved", "improved")), ["chat", "xml"]
    )
    assert chosen == {
        "adapter": "chat",
        "why": "gate verdicts seed, hand: ['improved', 'not worse']",
    }
    kept = decide(
        verdicts(chat=("improved", "inconclusive"), xml=("not worse", "not worse")), ["chat", "xml"]
    )
    assert kept["adapter"] == "json"
    assert kept["chat"] == ["improved", "inconclusive"] and kept["xml"] == [
        "not worse",
        "not worse",
    ]
    assert adapter_ab.DESIGN["procedural"]["seed"] not in (7, 27, 42)  # fresh users
    assert set(adapter_ab.DESIGN["arms"]) == {
        f"{p}/{a}" for p in ("seed", "hand") for a in ("json", "chat", "xml")
    }
