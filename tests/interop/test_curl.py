"""``curl`` (the documented recipes of docs/PROTOCOL-http.md): ``curl -N`` reading SSE while
other curls POST upstream, and the full-duplex NDJSON stream with ``curl -N -T .``, each
answer read before the next line is written. Then a caught-up stream resume with curl:
its head must arrive before curl has sent a body byte.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from ..support import hello_payload, timeout
from .conftest import QUIET, need_program


def envelope(seq: int, type: str, channel: str, payload: dict[str, Any]) -> str:
    return json.dumps({"id": f"c{seq}", "session": "", "seq": str(seq), "ts": "0",
                       "type": type, "channel": channel, "payload": payload},
                      separators=(",", ":"))


def data_of(line: str) -> dict[str, Any]:
    return json.loads(line.split(":", 1)[1])


def test_curl_sse_downstream_and_posts(make_server, processes):
    curl = need_program("curl", "curl")
    server = make_server(**QUIET)
    token = server.issue_token("curl-sse")
    base = server.base_url
    sse = processes([curl, "-N", "-s", f"{base}/proto/sse?token={token}"])
    sse.expect(lambda line: line == "event: session", what="the session event")
    sid = json.loads(sse.expect(lambda line: line.startswith("data:"))[5:])["session"]

    def post(body: str) -> dict[str, Any]:
        out = subprocess.run(
            [curl, "-s", "-X", "POST", f"{base}/proto/sse?session={sid}",
             "-H", f"Authorization: Bearer {token}", "--data-binary", body],
            capture_output=True, text=True, timeout=timeout(10), check=True).stdout
        return json.loads(out)

    assert post(envelope(1, "HELLO", "SYSTEM", hello_payload())) == {"accepted": 1}
    hello = data_of(sse.expect(lambda line: '"type":"HELLO"' in line, what="HELLO"))
    assert hello["payload"]["session"] == sid
    ndjson = "\n".join([
        envelope(2, "TOOL_CALL", "USER", {"call_id": "t1", "tool": "add",
                                          "params": {"a": 2, "b": 3}}),
        envelope(3, "PING", "SYSTEM", {"nonce": "n1"})])
    assert post(ndjson) == {"accepted": 2}
    done = data_of(sse.expect(lambda line: '"type":"TOOL_DONE"' in line, what="TOOL_DONE"))
    assert done["payload"]["result"] == {"result": 5}
    pong = data_of(sse.expect(lambda line: '"type":"PONG"' in line, what="PONG"))
    assert pong["payload"] == {"nonce": "n1"}
    ids = [line[4:] for line in sse.lines if line.startswith("id: ")]
    assert ids == [f"{sid}:{n}" for n in range(1, 4)]


def test_curl_duplex_stream_with_dot_and_a_caught_up_resume(make_server, processes):
    curl = need_program("curl", "curl")
    server = make_server(**QUIET)
    token = server.issue_token("curl-stream")
    base = server.base_url
    common = ["-N", "-s", "-i", "-H", f"Authorization: Bearer {token}",
              "-H", "Content-Type: application/x-ndjson", "-T", "."]
    stream = processes([curl, *common, "-X", "POST", f"{base}/proto/stream"], stdin=True)

    def say(line: str, then: str) -> dict[str, Any]:
        stream.write(line.encode() + b"\n")
        return json.loads(stream.expect(lambda out: f'"type":"{then}"' in out, what=then))

    hello = say(envelope(1, "HELLO", "SYSTEM", hello_payload()), "HELLO")
    sid = hello["payload"]["session"]
    assert any(line.lower() == f"proto-session: {sid}" for line in stream.lines)
    assert say(envelope(2, "PING", "SYSTEM", {"nonce": "n1"}), "PONG")["payload"] == \
        {"nonce": "n1"}
    assert say("oops", "ERROR")["payload"]["code"] == "INVALID_MESSAGE"
    done = say(envelope(3, "TOOL_CALL", "USER", {"call_id": "t1", "tool": "echo",
                                                 "params": {"message": "hi"}}), "TOOL_DONE")
    assert done["payload"]["result"] == {"echoed": "hi"}
    last = done["seq"]
    stream.stop()

    # resume with nothing to replay: curl shows the head before any line is typed (curl
    # buffers its -i output when stdout is a pipe: stdbuf gives it a terminal's lines)
    stdbuf = need_program("stdbuf", "coreutils")
    resumed = processes([stdbuf, "-oL", curl, *common, "-X", "POST",
                         f"{base}/proto/stream?session={sid}&last_seq={last}"], stdin=True)
    resumed.expect(lambda line: line.startswith("HTTP/1.1 200"), what="the 200 head")
    resumed.expect(lambda line: line.lower() == f"proto-session: {sid}", what="Proto-Session")
    resumed.write(envelope(4, "PING", "SYSTEM", {"nonce": "n2"}).encode() + b"\n")
    pong = json.loads(resumed.expect(lambda out: '"type":"PONG"' in out, what="PONG"))
    assert pong["payload"] == {"nonce": "n2"} and int(pong["seq"]) == int(last) + 1
