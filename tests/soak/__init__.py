"""The soak: thousands of connect / HELLO / PING / tool / text / disconnect rounds across
the three transports against a real server in its own process (gunicorn running
tests/fixtures/hardening_app.py), with drops and resumes mixed in; every reply is checked
and counted, and the server's RSS and greenlets are sampled through /debug/vitals.

    python -m tests.soak --minutes 30          # the long run (docs/RELIABILITY.md)
    python -m pytest tests/soak                # the bounded CI run (PROTOFLASK_SOAK_SECONDS)
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..hardening_support import vitals
from ..support import CLIENTS, BaseClient

TRANSPORTS = ("websocket", "sse", "stream")


@dataclass
class Figures:
    seconds: float = 0.0
    rounds: int = 0
    by_transport: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TRANSPORTS, 0))
    messages_sent: int = 0
    replies_expected: int = 0
    replies_received: int = 0
    tool_calls: int = 0
    resumes: int = 0
    errors: list[str] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, Any] = field(default_factory=dict)
    warm: dict[str, Any] = field(default_factory=dict)
    final: dict[str, Any] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        return self.replies_expected - self.replies_received

    @property
    def peak_rss(self) -> int:
        return max([s["rss"] for s in self.samples] + [self.final.get("rss", 0)])

    @property
    def peak_greenlets(self) -> int:
        return max([s["greenletsRunning"] for s in self.samples] + [0])

    def table(self) -> str:
        mib = 1024 * 1024
        rows = [
            ("duration", f"{self.seconds:.0f} s"),
            ("rounds (connect, HELLO, PING, tool, text or resume, close)",
             f"{self.rounds} ({', '.join(f'{k} {v}' for k, v in self.by_transport.items())})"),
            ("messages sent / replies expected / received",
             f"{self.messages_sent} / {self.replies_expected} / {self.replies_received}"),
            ("tool calls / resumes after a drop", f"{self.tool_calls} / {self.resumes}"),
            ("messages lost", str(self.lost)),
            ("errors", str(len(self.errors))),
            ("RSS: start / after warm-up / peak / final",
             f"{self.baseline.get('rss', 0) / mib:.1f} / {self.warm.get('rss', 0) / mib:.1f} / "
             f"{self.peak_rss / mib:.1f} / {self.final.get('rss', 0) / mib:.1f} MiB"),
            ("greenlets running: start / peak / final",
             f"{self.baseline.get('greenletsRunning')} / {self.peak_greenlets} / "
             f"{self.final.get('greenletsRunning')}"),
            ("sessions / active connections at the end",
             f"{self.final.get('sessions')} / {self.final.get('activeConnections')}"),
        ]
        return "\n".join(["| measure | value |", "|---|---|"] +
                         [f"| {k} | {v} |" for k, v in rows])


class _Round:
    """One connection's life; every expected reply is counted, every surprise recorded."""

    def __init__(self, figures: Figures, lock: threading.Lock) -> None:
        self.figures = figures
        self.lock = lock

    def count(self, sent: int = 0, expected: int = 0, received: int = 0, tools: int = 0) -> None:
        with self.lock:
            self.figures.messages_sent += sent
            self.figures.replies_expected += expected
            self.figures.replies_received += received
            self.figures.tool_calls += tools

    def run(self, base_url: str, token: str, transport: str, n: int) -> None:
        client = CLIENTS[transport](base_url, token)
        try:
            client.hello()
            self.count(sent=1, expected=1, received=1)
            self.ping(client, f"p{n}")
            kind = n % 4
            if kind == 0:
                self.tool(client, "add", {"a": n, "b": 1}, {"result": n + 1})
            elif kind == 1:
                self.tool(client, "sleep", {"seconds": 0.02}, {"slept": 0.02})
            elif kind == 2:
                self.text(client, f"text {n}")
            else:
                client = self.drop_and_resume(base_url, token, client, n)
        finally:
            client.close()

    def ping(self, client: BaseClient, nonce: str) -> None:
        client.send("PING", "SYSTEM", {"nonce": nonce})
        self.count(sent=1, expected=1)
        client.recv_type("PONG", nonce=nonce, within=20)
        self.count(received=1)

    def tool(self, client: BaseClient, tool: str, params: dict, result: dict) -> None:
        call_id = f"{tool}-{id(client)}"
        client.send("TOOL_CALL", payload={"call_id": call_id, "tool": tool, "params": params})
        self.count(sent=1, expected=1, tools=1)
        done = client.recv_type("TOOL_DONE", call_id=call_id, within=20)
        if done["payload"].get("result") != result:
            raise AssertionError(f"tool {tool} answered {done['payload']}")
        self.count(received=1)

    def text(self, client: BaseClient, text: str) -> None:
        client.send("MESSAGE_START", payload={"message_id": "m", "content_type": "text/plain"})
        client.send("MESSAGE_PART", payload={"message_id": "m", "content": text})
        client.send("MESSAGE_END", payload={"message_id": "m"})
        self.count(sent=3, expected=1)
        client.recv_type("MESSAGE_END", within=20)
        parts = [m["payload"]["content"] for m in client.received if m["type"] == "MESSAGE_PART"]
        if parts != [text]:
            raise AssertionError(f"echo was {parts}")
        self.count(received=1)

    def drop_and_resume(self, base_url: str, token: str, client: BaseClient,
                        n: int) -> BaseClient:
        """A message sent to the session while it has no connection must arrive on the
        resume, after everything the client had already seen, with no gap."""
        client.send("TOOL_CALL", payload={"call_id": "late", "tool": "sleep",
                                          "params": {"seconds": 0.05}})
        self.count(sent=1, expected=1, tools=1)
        seen = max(int(m["seq"]) for m in client.received)
        sid, next_seq = client.session_id, client.envelopes.last_seq + 1
        client.drop()
        time.sleep(0.1)  # the tool finishes while nobody is connected: that is the point
        resumed = type(client)(base_url, token, session=sid, last_seq=seen)
        resumed.envelopes = type(client.envelopes)(next_seq)
        done = resumed.recv_type("TOOL_DONE", call_id="late", within=20)
        seqs = [int(m["seq"]) for m in resumed.received]
        if seqs[0] != seen + 1 or seqs != list(range(seqs[0], seqs[0] + len(seqs))):
            raise AssertionError(f"replay after {seen} was {seqs}")
        if done["payload"]["status"] != "OK":
            raise AssertionError(f"late tool: {done['payload']}")
        self.count(received=1)
        with self.lock:
            self.figures.resumes += 1
        self.ping(resumed, f"r{n}")
        return resumed


def run_soak(base_url: str, token_for: Callable[[str], str], seconds: float,
             workers: int = 4, warmup: float = 10.0, sample_every: float = 5.0,
             report: Callable[[str], None] | None = None) -> Figures:
    """Cycle rounds from ``workers`` threads for ``seconds``; return what was measured.
    The server must have /debug/vitals on."""
    figures = Figures(baseline=vitals(base_url))
    lock = threading.Lock()
    started = time.monotonic()
    stop_at = started + seconds
    counter = itertools.count()

    def worker(index: int) -> None:
        token = token_for(f"soak-{index}")
        runner = _Round(figures, lock)
        while time.monotonic() < stop_at:
            n = next(counter)
            transport = TRANSPORTS[n % len(TRANSPORTS)]
            try:
                runner.run(base_url, token, transport, n)
            except Exception as exc:  # counted, and the soak goes on
                with lock:
                    figures.errors.append(f"{transport} round {n}: {exc!r}"[:300])
            with lock:
                figures.rounds += 1
                figures.by_transport[transport] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    next_sample = started + min(warmup, seconds / 4)
    warm_taken = False
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        if time.monotonic() >= next_sample:
            sample = vitals(base_url)
            figures.samples.append(sample)
            if not warm_taken:
                figures.warm, warm_taken = sample, True
            next_sample += sample_every
            if report:
                report(f"{time.monotonic() - started:6.0f}s rounds={figures.rounds} "
                       f"rss={sample['rss'] / 1048576:.1f}MiB "
                       f"greenlets={sample['greenletsRunning']} "
                       f"active={sample['activeConnections']} errors={len(figures.errors)}")
    for thread in threads:
        thread.join()
    figures.seconds = time.monotonic() - started
    return figures


__all__ = ["Figures", "run_soak"]
