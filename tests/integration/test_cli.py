"""The standalone entry points: `protoflask serve --dev` and ProtoServer.serve_forever()
in a plain script, each stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import requests

from ..support import ROOT, timeout, wait_for


def read_port(proc: subprocess.Popen, marker: str) -> int:
    line = wait_for(lambda: proc.stdout.readline(), within=20, what=marker)
    assert marker in line, line
    return int(line.split(":")[-1].split()[0].split("/")[0])


def test_cli_serve_dev_prints_a_token_that_works_and_stops_on_sigterm(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JWT_SECRET"}
    env["PROTOFLASK_DEV_TOKEN_FILE"] = str(tmp_path / "dev-token.json")  # not ~/.cache
    proc = subprocess.Popen([sys.executable, "-m", "protoflask.cli", "serve", "--dev",
                             "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        port = read_port(proc, "listening on http://")
        assert "development mode" in proc.stdout.readline()
        export = proc.stdout.readline().strip()
        assert export.startswith("export PROTOFLASK_TOKEN=")
        token = export.split("=", 1)[1]
        from ..support import WSClient

        with WSClient(f"http://127.0.0.1:{port}", token) as client:
            assert client.hello()["payload"]["session"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout(15)) == 0
        # gevent patched before anything imported ssl (jwt does): no MonkeyPatchWarning
        assert "MonkeyPatchWarning" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_serve_forever_in_a_plain_script():
    script = textwrap.dedent("""
        import signal, threading, time
        from protoflask import ProtoServer
        server = ProtoServer({"port": 0, "host": "127.0.0.1", "jwtSecret": "s" * 40,
                              "enableLogging": False})
        server.on("stopped", lambda: print("stopped", flush=True))
        server.start()

        def announce():  # once serve_forever handles SIGTERM: before, it would kill
            while signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                time.sleep(0.01)
            print(f"port: {server.port}", flush=True)

        threading.Thread(target=announce, daemon=True).start()
        server.serve_forever()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    try:
        port = read_port(proc, "port:")
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=5).ok
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout(15)) == 0
        assert "stopped" in proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
