"""Resumes in a loop do not walk past the per-user connection cap (issue 24, item 3).

A resume takes over its session's transport; the one it replaces is closed (4002) and
waits up to its close timeout for the client's close frame. A client that never answers
it used to keep every replaced transport counted until then, so a user resuming in a
loop held many times maxConnectionsPerUser (one user held 999 of 1,000 slots, others got
503). Now a replaced transport gives its slot back as it is replaced: after any number
of resumes the user holds one slot for the session, and can still open as many other
connections as the cap leaves, and no more.
"""

from __future__ import annotations

import pytest

from ..hardening_support import Live, answers, call_endpoint, error_code, vitals, ws_open
from ..support import WSClient

CAP = 3
RESUMES = 8


@pytest.fixture(scope="module", params=["embedded", "gunicorn"])
def live(request):
    server = Live(request.param, maxConnections=2 * CAP + 2, maxConnectionsPerUser=CAP,
                  replayWindowTime=60000)
    try:
        yield server
    finally:
        server.stop()


def test_a_replaced_transport_stops_counting_when_it_is_replaced(live):
    token = live.token("churner")
    first = WSClient(live.base_url, token)
    first.hello()
    session = first.session_id
    replaced = []
    try:
        for _ in range(RESUMES):  # none of these ever answers the server's close frame
            replaced.append(ws_open(live.base_url, token, f"&session={session}&last_seq=0"))
        # the user holds one slot (the session's live transport): CAP - 1 others open
        others = [WSClient(live.base_url, token) for _ in range(CAP - 1)]
        try:
            status, _, body = call_endpoint(live.base_url, "websocket", token)
            assert (status, error_code(body)) == (503, "USER_CONNECTION_LIMIT"), (status, body)
            assert vitals(live.base_url)["activeConnections"] <= CAP
            # everyone else still gets in: the server is not full of replaced transports
            answers(live.base_url, live.token("bystander"))
        finally:
            for other in others:
                other.close()
    finally:
        first.close()
        for sock in replaced:
            sock.close()
