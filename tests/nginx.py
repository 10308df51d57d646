"""deploy/nginx/protoflask.conf run by nginx in front of a test's (or a bench's) servers:
only its upstream servers, listen port and log path are swapped for their own."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import requests

from .support import ROOT, wait_for

CONF = ROOT / "deploy" / "nginx" / "protoflask.conf"


class Nginx:
    """nginx with deploy/nginx/protoflask.conf, as a plain process (no master, no
    daemon) with a prefix of its own, round robin over ``backend_ports``."""

    def __init__(self, nginx: str, backend_ports: list[int], tmp: Path) -> None:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.access_log = tmp / "access.log"
        self.error_log = tmp / "error.log"
        site = CONF.read_text()
        servers = "\n  ".join(f"server 127.0.0.1:{port};" for port in backend_ports)
        for old, new in (("server 127.0.0.1:8080;", servers),
                         ("listen 80;", f"listen 127.0.0.1:{self.port};"),
                         ("/var/log/nginx/protoflask.access.log", str(self.access_log))):
            assert site.count(old) == 1, f"{CONF} no longer has {old!r} once"
            site = site.replace(old, new)
        (tmp / "protoflask.conf").write_text(site)
        temp_paths = "\n".join(f"  {kind}_temp_path {tmp / kind};" for kind in
                               ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (tmp / "nginx.conf").write_text(f"""
daemon off;
master_process off;
worker_processes 1;
pid {tmp / "nginx.pid"};
error_log {tmp / "error.log"} info;
events {{ worker_connections 256; }}
http {{
{temp_paths}
  include {tmp / "protoflask.conf"};
}}
""")
        # -e: the error log before the config is read (the default path may not be
        # writable for a non-root user)
        self.command = [nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf"),
                        "-e", str(self.error_log)]
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        try:
            wait_for(self._up, within=10, what="nginx to answer")
        except BaseException:
            self.stop()
            raise

    def restart(self) -> None:
        """SIGKILL and start again on the same port: every connection through it is
        reset, as a crashed balancer would reset them."""
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._start()

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            out = self.proc.stdout.read().decode() if self.proc.stdout else ""
            raise AssertionError(f"nginx exited with {self.proc.returncode}: {out}")
        try:
            return requests.get(self.base_url + "/health", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
