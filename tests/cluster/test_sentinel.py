"""Redis Sentinel: nodes configured with ``redis+sentinel://`` (or ``REDIS_SENTINELS`` and
the master's name) follow the master the sentinels name. Real processes on private ports:
a master, its replica and one sentinel (``redis-server --sentinel``). The master is
killed; the sentinel promotes the replica; the nodes reconnect to it, copy their sessions
over, and a session resumed on the other node afterwards replays everything it missed:
the failover loses no message."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import redis
import requests

from protoflask import ProtoServer
from protoflask.config import ConfigError, ServerConfig

from ..support import PrivateRedis, WSClient, free_listener, timeout, wait_for
from .notes import note
from .retry import when_served


def free_port() -> int:
    listener = free_listener()
    port = int(listener.getsockname()[1])
    listener.close()
    return port


class Sentinel:
    """A replica of ``master`` and one sentinel watching it (quorum 1)."""

    def __init__(self, master: PrivateRedis, tmp: Path) -> None:
        binary = master.binary
        self.replica_port, self.port = free_port(), free_port()
        self.replica = subprocess.Popen(
            [binary, "--port", str(self.replica_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--replicaof", "127.0.0.1", str(master.port),
             "--dir", str(tmp)],  # (where it keeps the RDB its sync brings)
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        replica = redis.Redis(port=self.replica_port, socket_timeout=1)
        self.sentinel: subprocess.Popen[bytes] | None = None
        try:
            wait_for(lambda: self._in_sync(replica), within=15, what="the replica in sync")
            # The sentinel learns of replicas from the master's INFO, asked every 10 s: one
            # started before the replica was in sync knew none for up to 10 s, and a master
            # killed then was never failed over (the test's flake). Started now, its first
            # INFO lists the replica; waiting until it says so closes the window.
            conf = tmp / "sentinel.conf"
            conf.write_text(f"port {self.port}\nbind 127.0.0.1\ndir {tmp}\n"
                            f"sentinel monitor pf 127.0.0.1 {master.port} 1\n"
                            "sentinel down-after-milliseconds pf 1000\n"
                            "sentinel failover-timeout pf 5000\n")
            self.sentinel = subprocess.Popen([binary, str(conf), "--sentinel"],
                                             stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL)
            wait_for(lambda: self.master_port() == master.port, within=15,
                     what="the sentinel to see the master")
            wait_for(self._knows_replica, within=15, what="the sentinel to know the replica")
        except BaseException:
            self.kill()
            raise
        self.url = f"redis+sentinel://127.0.0.1:{self.port}/pf"

    def _knows_replica(self) -> bool:
        try:
            replicas = redis.Redis(port=self.port, socket_timeout=1).sentinel_slaves("pf")
        except redis.RedisError:
            return False
        return any(int(r.get("port", 0)) == self.replica_port for r in replicas)

    @staticmethod
    def _in_sync(client: redis.Redis) -> bool:
        try:
            return client.info("replication").get("master_link_status") == "up"
        except redis.RedisError:
            return False

    def master_port(self) -> int | None:
        try:
            addr = redis.Redis(port=self.port, socket_timeout=1).execute_command(
                "SENTINEL", "get-master-addr-by-name", "pf")
        except redis.RedisError:
            return None
        return int(addr[1]) if addr else None

    def kill(self) -> None:
        for proc in (self.sentinel, self.replica):
            if proc is not None:
                proc.kill()
                proc.wait()


@pytest.fixture
def sentinel(private_redis: PrivateRedis, tmp_path: Path) -> Iterator[Sentinel]:
    watched = Sentinel(private_redis, tmp_path)
    try:
        yield watched
    finally:
        watched.kill()


def health(node: ProtoServer) -> str:
    return requests.get(node.base_url + "/health", timeout=timeout(5)).json()["status"]


def test_a_sentinel_failover_loses_no_message(
        sentinel: Sentinel, private_redis: PrivateRedis,
        make_server: Callable[..., ProtoServer]) -> None:
    # `sentinel` before `make_server`: fixtures are torn down in reverse, so the nodes stop
    # while the new master still answers (stopping against a dead sentinel costs each one
    # its Redis timeouts: 25 s of the suite).
    # one node configured as REDIS_SENTINELS + REDIS_SENTINEL_MASTER, the other by URL
    a = make_server(redisSentinels=[f"127.0.0.1:{sentinel.port}"], redisSentinelMaster="pf")
    b = make_server(redisUrl=sentinel.url)
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    resumed: Any = None
    try:
        client.hello()
        for n in range(3):
            b.send_message(client.session_id, note(n))  # through Redis: the master
        for _ in range(3):
            client.recv_type("NOTE")
        seen = int(client.received[-1]["seq"])
        private_redis.kill()  # the master dies
        for n in (3, 4):  # sent on its node meanwhile: in its memory, copied over later
            a.send_message(client.session_id, note(n))
        client.drop()
        wait_for(lambda: sentinel.master_port() == sentinel.replica_port, within=30,
                 what="the sentinel to promote the replica")
        wait_for(lambda: health(a) == "ok" and health(b) == "ok", within=30,
                 what="both nodes on the new master")
        b.send_message(client.session_id, note(5))
        resumed = when_served(lambda: WSClient(b.base_url, token, session=client.session_id,
                                               last_seq=seen), within=20)
        got = [resumed.recv_type("NOTE")["payload"]["n"] for _ in range(3)]
        assert got == [3, 4, 5]
        seqs = [int(m["seq"]) for m in resumed.received]
        assert seqs == list(range(seen + 1, seen + 1 + len(seqs))), (seen, seqs)
    finally:
        client.close()
        if resumed is not None:
            resumed.close()


def test_redis_sentinels_spell_the_sentinel_url() -> None:
    config = ServerConfig.load({}, environ={"REDIS_SENTINELS": "10.0.0.1:26379, s2:26380",
                                            "REDIS_SENTINEL_MASTER": "pf"})
    assert config.redis_target == "redis+sentinel://10.0.0.1:26379,s2:26380/pf"
    assert ServerConfig.load({}, environ={"REDIS_SENTINELS": "h:1"}).redis_target == \
        "redis+sentinel://h:1/mymaster"  # Sentinel's own default name
    assert ServerConfig.load({}, environ={}).redis_target is None


@pytest.mark.parametrize("environ,message", [
    ({"REDIS_SENTINELS": "h:26379", "REDIS_URL": "redis://h:6379"}, "not both"),
    ({"REDIS_SENTINELS": "h"}, "not host:port"),
    ({"REDIS_SENTINELS": "h:port"}, "not host:port"),
    ({"REDIS_SENTINELS": "h:1", "REDIS_SENTINEL_MASTER": "a/b"}, "not a master name"),
])
def test_bad_redis_sentinels_name_the_key(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ServerConfig.load({}, environ=environ)
