"""The Redis of bench/cluster_chaos.py: a private redis-server (never the shared one:
the soak flushes, stops and restarts it), or with ``--sentinel`` a master, its replica
and a real ``redis-server --sentinel`` watching them, the nodes following the master
the sentinel names (REDIS_SENTINELS). Faults act on whichever server is master now."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support import PrivateRedis, free_listener, wait_for  # noqa: E402

MASTER = "chaos"


def free_port() -> int:
    listener = free_listener()
    port = int(listener.getsockname()[1])
    listener.close()
    return port


def answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_connect_timeout=0.2).ping())
    except redis.RedisError:
        return False


class Server:
    """One redis-server on a fixed port, started again on it as asked."""

    def __init__(self, binary: str, port: int, tmp: Path, replica_of: int | None) -> None:
        self.binary, self.port, self.tmp = binary, port, tmp
        self.proc: subprocess.Popen[bytes] | None = None
        self.start(replica_of)

    def start(self, replica_of: int | None = None) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.tmp),
                "--dbfilename", f"dump-{self.port}.rdb"]
        if replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(replica_of)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_for(lambda: answers(self.port), 15, f"redis-server on {self.port}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class SentinelRedis:
    """A master, a replica and one sentinel (quorum 1). Automatic failover is slow
    (down-after 120 s, longer than any outage, so an outage stays an outage); the
    ``failover`` fault kills the master and asks the sentinel to promote the replica
    (SENTINEL FAILOVER), then starts the old master again as a replica of the new one."""

    def __init__(self, tmp: Path) -> None:
        found = shutil.which("redis-server")
        if found is None:
            raise SystemExit("needs redis-server on PATH")
        self.tmp = tmp
        a, b = free_port(), free_port()
        self.servers = {a: Server(found, a, tmp, None), b: Server(found, b, tmp, a)}
        self.sentinel_port = free_port()
        conf = tmp / "sentinel.conf"
        conf.write_text(f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {tmp}\n"
                        f"sentinel monitor {MASTER} 127.0.0.1 {a} 1\n"
                        f"sentinel down-after-milliseconds {MASTER} 120000\n"
                        f"sentinel failover-timeout {MASTER} 10000\n")
        self.sentinel = subprocess.Popen([found, str(conf), "--sentinel"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: self.master_port() == a, 15, "the sentinel to see the master")
        wait_for(lambda: self._in_sync(b), 15, "the replica in sync")
        self.env = {"REDIS_SENTINELS": f"127.0.0.1:{self.sentinel_port}",
                    "REDIS_SENTINEL_MASTER": MASTER}

    def _in_sync(self, port: int) -> bool:
        try:
            info = redis.Redis(port=port, socket_timeout=1).info("replication")
        except redis.RedisError:
            return False
        return info.get("master_link_status") == "up"

    def master_port(self) -> int | None:
        try:
            addr = redis.Redis(port=self.sentinel_port, socket_timeout=1).execute_command(
                "SENTINEL", "get-master-addr-by-name", MASTER)
        except redis.RedisError:
            return None
        return int(addr[1]) if addr else None

    @property
    def master(self) -> Server:
        port = self.master_port()
        assert port is not None, "the sentinel names no master"
        return self.servers[port]

    def replica_port(self) -> int:
        return next(p for p in self.servers if p != self.master_port())

    def rdb(self) -> redis.Redis:
        return redis.Redis(port=self.master.port, socket_timeout=2)

    def restart_empty(self) -> None:
        master = self.master
        master.kill()
        master.start()

    def stop_for(self, seconds: float) -> None:
        proc = self.master.proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        proc.send_signal(signal.SIGCONT)

    def failover(self) -> None:
        old, new = self.master, self.replica_port()
        old.kill()
        sentinel = redis.Redis(port=self.sentinel_port, socket_timeout=5)
        wait_for(lambda: self._failover(sentinel) and self.master_port() == new, 60,
             "the sentinel to promote the replica")
        old.start(replica_of=new)
        wait_for(lambda: self._in_sync(old.port), 30, "the old master to sync as a replica")

    @staticmethod
    def _failover(sentinel: redis.Redis) -> bool:
        try:
            sentinel.execute_command("SENTINEL", "FAILOVER", MASTER)
        except redis.RedisError:
            pass  # one in progress already: wait for it
        return True

    def kill(self) -> None:
        self.sentinel.kill()
        self.sentinel.wait()
        for server in self.servers.values():
            server.kill()


class PlainRedis:
    """One private redis-server (REDIS_URL), with the same faults."""

    def __init__(self) -> None:
        self.server = PrivateRedis()
        self.env = {"REDIS_URL": self.server.url}

    def rdb(self) -> redis.Redis:
        return redis.Redis.from_url(self.server.url, socket_timeout=2)

    def restart_empty(self) -> None:
        self.server.kill()
        self.server.start()

    def stop_for(self, seconds: float) -> None:
        proc = self.server.proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        proc.send_signal(signal.SIGCONT)

    def failover(self) -> None:
        raise SystemExit("the failover fault needs --sentinel")

    def kill(self) -> None:
        self.server.kill()
