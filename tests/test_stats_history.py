"""stats.Stats' per-second history for the dashboard charts: one sample per completed
second from the 10 s buckets, gaps filled, the peak connection count of the interval, and
bounded to HISTORY_SECONDS."""

from __future__ import annotations

from protoflask.stats import HISTORY_SECONDS, Stats


def test_each_completed_second_becomes_one_sample():
    stats = Stats(now=100_000)
    stats.record(100_200, 2.0)
    stats.record(100_900, 4.0)
    stats.connection_opened("websocket")
    stats.connection_closed("websocket")  # open for a moment only: the peak still shows it
    stats.errors_sent = 1
    stats.sample(100_500)  # second 100 is not over yet
    assert list(stats.history) == []
    stats.sample(101_010)
    assert list(stats.history) == [[100_000, 1, 2, 3.0, 1]]
    stats.record(101_500, 1.0)
    stats.sample(104_000)  # the ticker was late: 101, 102 and 103 all come now
    assert [s[0] for s in stats.history] == [100_000, 101_000, 102_000, 103_000]
    assert [s[2] for s in stats.history] == [2, 1, 0, 0]
    assert [s[1] for s in stats.history][1:] == [0, 0, 0]
    assert [s[4] for s in stats.history][1:] == [0, 0, 0]


def test_connections_by_transport_and_the_history_bound():
    stats = Stats(now=0)
    stats.connection_opened("sse")
    stats.connection_opened("sse")
    stats.connection_opened("stream")
    stats.connection_closed("sse")
    assert stats.connections_active == {"sse": 1, "stream": 1}
    assert stats.connections_opened == {"sse": 2, "stream": 1}
    assert (stats.active_connections, stats.total_connections) == (2, 3)
    stats.sample((HISTORY_SECONDS + 50) * 1000)
    assert len(stats.history) == HISTORY_SECONDS
    assert stats.history[-1][0] == (HISTORY_SECONDS + 49) * 1000
