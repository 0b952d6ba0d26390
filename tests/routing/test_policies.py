"""Each policy's choice on hand-made states, and the imbalance thresholds."""

from __future__ import annotations

from prefixgate.routing.policies import (
    Balance,
    Replica,
    imbalanced,
    order_least_busy,
    order_prefix,
    order_round_robin,
    order_session,
    rendezvous,
)

URLS = ["http://a/v1", "http://b/v1", "http://c/v1", "http://d/v1"]


def test_round_robin_rotates_and_keeps_every_replica_for_failover():
    assert order_round_robin(URLS, 0) == URLS
    assert order_round_robin(URLS, 1) == URLS[1:] + URLS[:1]
    assert order_round_robin(URLS, 6)[0] == URLS[2]
    assert [order_round_robin(URLS, t)[0] for t in range(8)] == URLS * 2
    assert order_round_robin([], 3) == []


def test_least_busy_picks_fewest_in_flight_then_a_stable_tie_break():
    reps = [Replica(u, n) for u, n in zip(URLS, [3, 1, 2, 1], strict=True)]
    order = order_least_busy(reps, "k")
    assert set(order[:2]) == {URLS[1], URLS[3]}
    assert order[2:] == [URLS[2], URLS[0]]
    assert order == order_least_busy(list(reversed(reps)), "k")  # input order is irrelevant


def test_session_is_rendezvous_hashing_of_the_key():
    first = {order_session(URLS, f"s{i}")[0] for i in range(200)}
    assert first == set(URLS)  # keys spread over every replica
    assert order_session(URLS, "s1") == order_session(list(reversed(URLS)), "s1")
    # Removing a replica moves only the keys that were on it.
    for i in range(200):
        before = order_session(URLS, f"s{i}")[0]
        after = order_session(URLS[:3], f"s{i}")[0]
        assert after == before or before == URLS[3]


def test_rendezvous_is_deterministic_and_weighted():
    assert rendezvous("k", "m") == rendezvous("k", "m")
    heavy = sum(rendezvous(f"k{i}", "x", 3) > rendezvous(f"k{i}", "y", 1) for i in range(400))
    assert heavy > 250  # weight 3 vs 1 wins about 3/4 of the keys


def test_imbalance_needs_both_the_absolute_and_the_relative_threshold():
    b = Balance(abs=64, rel=1.5)
    assert not imbalanced([0, 64], b)  # max - min = 64: not more than 64
    assert imbalanced([0, 65], b)
    assert not imbalanced([200, 270], b)  # 70 > 64 but 270 < 1.5 * 200
    assert imbalanced([100, 170], b)  # 70 > 64 and 170 > 150
    assert not imbalanced([], b)
    assert not imbalanced([5, 5, 5], Balance(abs=0, rel=1.0))


def test_prefix_picks_the_best_match_when_balanced():
    reps = [Replica(URLS[0], 2, 10), Replica(URLS[1], 0, 80), Replica(URLS[2], 1, 40)]
    assert order_prefix(reps, 100, "k", Balance()) == [URLS[1], URLS[2], URLS[0]]


def test_prefix_ties_on_match_go_to_the_least_busy():
    reps = [Replica(URLS[0], 5, 50), Replica(URLS[1], 2, 50), Replica(URLS[2], 0, 10)]
    assert order_prefix(reps, 100, "k", Balance())[0] == URLS[1]


def test_prefix_below_the_match_threshold_goes_to_the_least_busy():
    reps = [Replica(URLS[0], 3, 29), Replica(URLS[1], 1, 0), Replica(URLS[2], 2, 5)]
    assert order_prefix(reps, 100, "k", Balance(match_threshold=0.3))[0] == URLS[1]
    assert order_prefix(reps, 100, "k", Balance(match_threshold=0.29))[0] == URLS[0]


def test_prefix_under_imbalance_goes_to_the_least_busy_despite_the_match():
    b = Balance(abs=4, rel=1.5)
    reps = [Replica(URLS[0], 16, 100), Replica(URLS[1], 11, 0)]
    assert order_prefix(reps, 100, "k", b)[0] == URLS[0]  # 5 > 4, but 16 < 1.5 * 11
    reps = [Replica(URLS[0], 10, 100), Replica(URLS[1], 6, 0)]
    assert order_prefix(reps, 100, "k", b)[0] == URLS[0]  # spread 4: not more than abs
    reps = [Replica(URLS[0], 11, 100), Replica(URLS[1], 2, 0)]
    assert order_prefix(reps, 100, "k", b)[0] == URLS[1]  # 9 > 4 and 11 > 3


def test_prefix_without_blocks_is_least_busy():
    reps = [Replica(URLS[0], 3, 0), Replica(URLS[1], 1, 0)]
    assert order_prefix(reps, 0, "k", Balance())[0] == URLS[1]
