"""Which upstream seqs a session has seen (seen.py): only a seq already seen is a
retransmission; the 1024 seqs below the highest are remembered one by one, older ones
count as seen."""

from __future__ import annotations

import random

import pytest

from protoflask.core.seen import WINDOW, SeenSeqs


def feed(seen: SeenSeqs, seqs) -> list[int]:
    """The seqs that were new, in order."""
    return [seq for seq in seqs if seen.first_time(seq)]


def test_in_order_every_seq_is_new_once_and_nothing_is_kept():
    seen = SeenSeqs()
    assert feed(seen, range(1, 5001)) == list(range(1, 5001))
    assert seen.highest == 5000 and seen.missing() == []
    assert feed(seen, range(1, 5001)) == []


def test_a_seq_below_the_highest_never_seen_is_new_once():
    seen = SeenSeqs()
    assert feed(seen, [1, 2, 5]) == [1, 2, 5]
    assert seen.missing() == [3, 4]
    assert feed(seen, [4, 4, 5, 2, 3, 3]) == [4, 3]
    assert seen.missing() == [] and seen.highest == 5


@pytest.mark.parametrize("seed", range(5))
def test_any_order_within_the_window_gives_each_seq_once(seed):
    rng = random.Random(seed)
    seqs = list(range(1, 2 * WINDOW))
    # shuffled in blocks no wider than the window (concurrent POSTs overtake each other
    # by a little, not by thousands)
    order = []
    for start in range(0, len(seqs), WINDOW // 2):
        block = seqs[start:start + WINDOW // 2]
        rng.shuffle(block)
        order += block
    with_resends = order + rng.sample(order, 300)
    rng.shuffle(with_resends)
    seen = SeenSeqs()
    new = feed(seen, order) + feed(seen, with_resends)
    assert sorted(new) == seqs


def test_remembers_exactly_the_window_below_the_highest():
    seen = SeenSeqs()
    top = 10 * WINDOW
    assert seen.first_time(top)  # everything below it is a gap
    assert seen.missing() == list(range(top - WINDOW, top))
    assert seen.first_time(top - WINDOW)  # the oldest remembered gap
    assert not seen.first_time(top - WINDOW - 1)  # older: counts as seen
    assert not seen.first_time(1)


def test_the_window_slides_with_the_highest():
    seen = SeenSeqs()
    assert feed(seen, [1, 3]) == [1, 3]  # 2 missing
    assert feed(seen, range(4, 3 + WINDOW)) == list(range(4, 3 + WINDOW))
    assert seen.missing() == [2]  # 2 is WINDOW below the highest: still remembered
    assert seen.first_time(3 + WINDOW)
    assert seen.missing() == []  # slid out: counts as seen now
    assert not seen.first_time(2)


@pytest.mark.parametrize("rise", [2, 63, 64, 65, WINDOW - 1, WINDOW, WINDOW + 1, 10**12])
def test_a_jump_of_any_size_keeps_the_skipped_seqs_open(rise):
    seen = SeenSeqs()
    assert feed(seen, [1, 2, 3]) == [1, 2, 3]
    top = 3 + rise
    assert seen.first_time(top)
    skipped = list(range(max(4, top - WINDOW), top))
    assert seen.missing() == skipped
    assert feed(seen, reversed(skipped)) == skipped[::-1]
    assert not seen.first_time(3)
    assert seen.missing() == []


def test_state_round_trips_through_its_missing_list():
    seen = SeenSeqs()
    feed(seen, [1, 2, 7, 9, 20])
    copy = SeenSeqs(seen.highest, seen.missing())
    assert copy.missing() == seen.missing() == [3, 4, 5, 6, 8, *range(10, 20)]
    assert feed(copy, range(1, 21)) == feed(seen, range(1, 21))


def test_a_session_in_order_keeps_no_memory():
    # the common case stays free: 0 is a shared small int
    seen = SeenSeqs()
    feed(seen, range(1, 100))
    assert seen._missing == 0


@pytest.mark.parametrize("seed", range(20))
def test_missing_lists_exactly_the_unseen_seqs_of_the_window(seed):
    # missing() walks only the set bits: held to the plain definition
    rng = random.Random(seed)
    seen = SeenSeqs()
    fed: set[int] = set()
    for seq in (rng.randint(1, 3 * WINDOW) for _ in range(rng.randint(1, 2 * WINDOW))):
        seen.first_time(seq)
        fed.add(seq)
        if rng.random() < 0.05:
            top = seen.highest
            assert seen.missing() == [s for s in range(max(1, top - WINDOW), top)
                                      if s not in fed]
