"""Lexical guards: real false-hit pairs are caught, paraphrases pass."""
from __future__ import annotations

import pytest

from cache_core.decision.guards import (GUARD_ORDER, date_mentions, entity_mentions, first_conflict,
                               number_mentions)

FALSE_HITS = [
    ("How do I enable two-factor auth?", "How do I disable two-factor auth?", "negation"),
    ("How do I activate my card?", "How do I deactivate my card?", "negation"),
    ("Can I unlock my card in the app?", "Can I lock my card in the app?", "negation"),
    ("I can't log in to my account", "I can log in to my account", "negation"),
    ("Why was my card declined?", "Why was my card accepted?", "negation"),
    ("My transfer has not arrived", "My transfer has arrived", "negation"),
    ("Is there a fee for never using the card?", "Is there a fee for using the card?", "negation"),
    ("transfer $50 to my savings", "transfer $500 to my savings", "numbers"),
    ("Is the exchange fee 2%?", "Is the exchange fee 3%?", "numbers"),
    ("I was charged 1,000 euros", "I was charged 100 euros", "numbers"),
    ("Send 5k to Tom", "Send 500 to Tom", "numbers"),
    ("Will my payment on Monday go through?", "Will my payment on Friday go through?", "dates"),
    ("I paid on May 3rd", "I paid on June 3rd", "dates"),
    ("statement for 2023-01-05", "statement for 2023-02-05", "dates"),
    ("What did I spend last month?", "What did I spend last week?", "dates"),
    ("Will it arrive tomorrow?", "Will it arrive today?", "dates"),
    ("Can I use my card in Spain?", "Can I use my card in France?", "entities"),
    ("How do I add money with Revolut?", "How do I add money with Monzo?", "entities"),
]

SAFE_PAIRS = [
    ("How do I reset my password?", "how can I reset my password"),
    ("My card hasn't arrived", "My card has not arrived yet"),
    ("Why can't I log in?", "Why cannot I log in?"),
    ("May I get a refund?", "Can I get a refund?"),
    ("transfer 1,000 dollars", "transfer 1000 dollars"),
    ("What is my PIN?", "what is my pin"),
    ("Where is my new card?", "When will my new card get here?"),
    ("HOW DO I TOP UP?", "How do I top up?"),
    ("The top-up is pending", "My top up is still pending"),
    ("Is the fee 2 percent?", "is the fee 2%"),
]


@pytest.mark.parametrize("query, cached, guard", FALSE_HITS)
def test_false_hit_pairs_are_blocked_by_the_right_guard(query, cached, guard):
    assert first_conflict(query, cached, GUARD_ORDER) == guard
    assert first_conflict(cached, query, GUARD_ORDER) == guard  # symmetric
    assert first_conflict(query, cached, [g for g in GUARD_ORDER if g != guard]) is None


@pytest.mark.parametrize("query, cached", SAFE_PAIRS)
def test_paraphrases_pass_every_guard(query, cached):
    assert first_conflict(query, cached, GUARD_ORDER) is None


def test_no_guard_enabled_or_identical_text_never_blocks():
    assert first_conflict("enable it", "disable it", []) is None
    assert first_conflict("Transfer $50 ", "transfer  $50", GUARD_ORDER) is None


def test_extractors_normalise():
    assert number_mentions("pay $1,250.50 or 10% or 2k") == {"1250.5", "10%", "2000"}
    assert number_mentions("on 2024-03-01") == set()  # date parts are the dates guard's
    assert date_mentions("Due Fri 12th") == {"weekday:friday", "day:12"}
    assert date_mentions("You may pay") == set()
    assert entity_mentions("can I pay with Apple Pay at the shop? Google works") == {"apple", "pay"}
    assert entity_mentions("Is my ATM card ok") == {"atm"}
