"""An opened stream's response as its own WSGI application (``HTTPDownstream.wsgi_app``,
what post_lane.py hands the server unless ``SessionPostLane.werkzeug_streams``) gives the
server the status and headers werkzeug's Response (``response()``, with the CORS headers
``web.add_cors`` puts on it) gives, and the same body. On the wire, against Flask's route:
tests/integration/test_upgrade_lane.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from protoflask.origins import OriginPolicy
from protoflask.transports.http import HTTPDownstream, _Body
from protoflask.transports.sse import SSEStream
from protoflask.transports.stream import NDJSONStream
from protoflask.web import add_cors, cors_headers

POLICIES = {"any origin": OriginPolicy([]),
            "an allow-list": OriginPolicy(["http://page.example", "https://*.example.org"])}
ORIGINS = [None, "http://page.example", "https://a.example.org", "http://evil.example"]


def downstream(cls: type[HTTPDownstream]) -> HTTPDownstream:
    port = SimpleNamespace(id="0123456789abcdef0123456789abcdef",
                           limits=SimpleNamespace(heartbeat_interval=30000),
                           ended=[])
    port.end = lambda: port.ended.append(True)
    return cls(port, {})  # type: ignore[arg-type]


def started(app: Any) -> tuple[str, list[tuple[str, str]], Any]:
    seen: list[Any] = []
    body = app({"REQUEST_METHOD": "GET"}, lambda status, headers: seen.extend([status, headers]))
    return seen[0], list(seen[1]), body


@pytest.mark.parametrize("cls", [SSEStream, NDJSONStream])
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("origin", ORIGINS)
@pytest.mark.parametrize("cors", [True, False])
def test_the_streams_app_starts_as_werkzeugs_response(cls: type[HTTPDownstream], policy: str,
                                                      origin: str | None, cors: bool) -> None:
    origins = POLICIES[policy]
    plain = downstream(cls)
    response = plain.response()
    if cors:
        add_cors(response, origin, origins)
    fast = downstream(cls)
    app = fast.wsgi_app(cors_headers(origin, origins) if cors else [])
    status, headers, body = started(app)
    plain_status, plain_headers, plain_body = started(response)
    assert (status, headers) == (plain_status, plain_headers)
    assert isinstance(body, _Body) and body._stream is fast
    # werkzeug's ClosingIterator closes the same kind of body: the stream's _Body
    assert isinstance(response.response, _Body) and response.response._stream is plain
    plain_body.close()
    body.close()
    assert plain.port.ended == fast.port.ended == [True]  # closing either ends the stream
