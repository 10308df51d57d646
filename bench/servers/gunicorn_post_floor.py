"""Floor: what gunicorn's gevent worker costs per keep-alive POST, with no app behind it.

    gunicorn -c bench/servers/gunicorn_bench.conf.py --chdir bench/servers gunicorn_post_floor:app

A plain WSGI callable (no Flask, no protoflask): it reads the body, counts its lines and
answers ``202 {"accepted": n}``, as protoflask answers an SSE or HTTP-stream upstream POST.
bench/run.py drives it with the same POSTs as protoflask's SSE row
(bench/http_downstream.py, transport ``floor``), so the per-request cost of gunicorn itself
(parsing, environ, response head, body read and write, syscalls) stands beside the
transports it underlies, in the same run. Any GET answers 200 (the readiness check).
"""

READY = b"ready\n"


def app(environ, start_response):
    if environ["REQUEST_METHOD"] != "POST":
        start_response("200 OK", [("Content-Type", "text/plain"),
                                  ("Content-Length", str(len(READY)))])
        return [READY]
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    answer = b'{"accepted":%d}' % body.count(b"\n")
    start_response("202 ACCEPTED", [("Content-Type", "application/json"),
                                    ("Content-Length", str(len(answer)))])
    return [answer]
