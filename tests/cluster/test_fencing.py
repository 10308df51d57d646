"""One holder at a time, and never a seq used twice, whatever Redis did: a node takes a
session over only from a holder that let go or is gone (a beat missing while Redis has
answered long enough to say so); a POST never moves a session; a session restored from a
copy older than what its client has seen goes on after the client's resume point and
says what it cannot replay; a session whose record Redis lost a moment ago is 503, not
404, until its holder writes it back."""

from __future__ import annotations

import base64
from typing import Any, Callable

import orjson
import redis
import requests

from protoflask import ProtoServer

from ..support import PrivateRedis, SSEClient, WSClient, timeout, wait_for
from .notes import note
from .retry import status_of, when_served


def refusal(connect: Callable[[], Any]) -> Exception:
    try:
        client = connect()
    except Exception as exc:  # noqa: BLE001 - the refusal is what the test reads
        return exc
    client.close()
    raise AssertionError("the connection was accepted")


def mute_node(rdb: redis.Redis, prefix: str, sid: str) -> None:
    """Make the session's record name a node that beats but does not listen (its
    listener reconnecting, say)."""
    rdb.set(f"{prefix}:node:mute", b"{}", px=60_000)
    rdb.hset(f"{prefix}:s:{sid}", "node", "mute")


def test_a_resume_never_takes_a_session_from_a_holder_that_beats_but_does_not_answer(
        make_node: Callable[..., ProtoServer], rdb: redis.Redis, prefix: str) -> None:
    a, b = make_node(), make_node()
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    client.hello()
    sid = client.session_id
    client.drop()
    wait_for(lambda: a.get_session(sid)["connected"] is False, what="the drop")
    a.hub.unhold(sid)  # as if a were the mute node: it no longer serves the session
    mute_node(rdb, prefix, sid)
    exc = refusal(lambda: WSClient(b.base_url, token, session=sid, last_seq=0))
    assert status_of(exc) == 503
    assert exc.response.headers["Retry-After"] == "1"  # type: ignore[attr-defined]
    assert rdb.hget(f"{prefix}:s:{sid}", "node") == b"mute"  # still its holder
    assert b.hub.get(sid) is None


def test_a_post_to_another_node_never_moves_the_session_and_is_kept_for_its_holder(
        make_node: Callable[..., ProtoServer], rdb: redis.Redis, prefix: str) -> None:
    a, b = make_node(), make_node()
    token = a.issue_token("alice")
    client = SSEClient(a.base_url, token)
    try:
        client.hello()
        sid = client.session_id
        mute_node(rdb, prefix, sid)  # a's listener cannot be reached for a moment
        body = client.envelopes.make("TOOL_CALL", payload={
            "call_id": "k1", "tool": "add", "params": {"a": 2, "b": 40}})
        resp = post_body(b, sid, token, body)
        assert resp.status_code == 202
        assert b.hub.get(sid) is None and rdb.hget(f"{prefix}:s:{sid}", "node") == b"mute"
        queued = [orjson.loads(i) for i in rdb.lrange(f"{prefix}:in:{sid}", 0, -1)]
        assert [orjson.loads(base64.b64decode(q["body"])) for q in queued] == [body]
        # the holder listens again (its record names it) and its next beat takes the body
        rdb.hset(f"{prefix}:s:{sid}", "node", a.hub.node_id)
        rdb.sadd(f"{prefix}:queued:{a.hub.node_id}", sid)
        done = client.recv_type("TOOL_DONE", within=5)
        assert done["payload"]["result"] == {"result": 42}
    finally:
        client.close()


def test_a_session_restored_from_an_older_copy_goes_on_after_the_clients_seq(
        make_node: Callable[..., ProtoServer], rdb: redis.Redis, prefix: str) -> None:
    a, b = make_node(), make_node()
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    client.hello()
    sid = client.session_id
    key, replay = f"{prefix}:s:{sid}", f"{prefix}:r:{sid}"
    old_state, old_window = rdb.hget(key, "state"), rdb.lrange(replay, 0, -1)
    for n in range(4):
        a.send_message(sid, note(n))
    for _ in range(4):
        client.recv_type("NOTE")
    seen = int(client.received[-1]["seq"])
    client.drop()
    wait_for(lambda: a.get_session(sid)["connected"] is False, what="the drop")
    # As if a had died while Redis could not take its writes: Redis holds the copy from
    # before those messages, and names a node that is gone.
    a.hub.unhold(sid)
    pipe = rdb.pipeline()
    pipe.hset(key, mapping={"node": "gone", "state": old_state})
    pipe.delete(replay)
    pipe.rpush(replay, *old_window)
    pipe.execute()
    assert orjson.loads(old_state)["downstream_seq"] < seen
    # (503 until node b has heard from Redis long enough to trust a missing beat)
    resumed = when_served(lambda: WSClient(b.base_url, token, session=sid, last_seq=seen))
    try:
        lost = resumed.recv_type("ERROR")
        assert lost["payload"]["code"] == "REPLAY_UNAVAILABLE"
        assert lost["payload"]["detail"]["first_available"] == str(seen + 1)
        b.send_message(sid, note(9))
        resumed.recv_type("NOTE")
        seqs = [int(m["seq"]) for m in resumed.received]
        assert seqs == list(range(seen + 1, seen + 1 + len(seqs))), (seen, seqs)
    finally:
        resumed.close()


def test_after_redis_lost_its_data_a_session_is_503_until_its_holder_writes_it_back(
        two_nodes: tuple[ProtoServer, ProtoServer], private_redis: PrivateRedis) -> None:
    a, b = two_nodes
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    try:
        client.hello()
        a.send_message(client.session_id, note(1))
        client.recv_type("NOTE")
        seen = int(client.received[-1]["seq"])
        a.send_message(client.session_id, note(2))
        client.drop()
        redis.Redis.from_url(private_redis.url).flushall()
        # a session nobody ever had: 503 for now (its holder might be writing it back)
        exc = refusal(lambda: WSClient(b.base_url, token, session="never-was", last_seq=0))
        assert status_of(exc) == 503
        statuses: list[int | None] = []

        def resume() -> WSClient:
            try:
                return WSClient(b.base_url, token, session=client.session_id, last_seq=seen)
            except Exception as exc:
                statuses.append(status_of(exc))
                raise

        resumed = when_served(resume)
        try:
            assert 404 not in statuses
            assert resumed.recv_type("NOTE")["payload"]["n"] == 2
        finally:
            resumed.close()
        # and once Redis has answered long enough, an unknown session is 404 again
        wait_for(lambda: status_of(refusal(lambda: WSClient(
            b.base_url, token, session="never-was", last_seq=0))) == 404, within=15,
            what="404 for a session nobody had")
    finally:
        client.close()


def post_body(node: ProtoServer, sid: str, token: str, body: dict[str, Any],
              within: float = 5) -> requests.Response:
    """A follow-up POST of one envelope to ``node``'s SSE route for session ``sid``."""
    return requests.post(f"{node.base_url}/proto/sse?session={sid}", json=body,
                         headers={"Authorization": f"Bearer {token}"}, timeout=timeout(within))


def test_a_post_is_202_only_once_the_holder_confirmed_it_has_the_body(
        make_node: Callable[..., ProtoServer], rdb: redis.Redis, prefix: str) -> None:
    # The holder hears the body (PUBLISH reaches it) and dies before reading it: the
    # poster must not answer 202 for a body nobody has.
    a, b = make_node(), make_node()
    token = a.issue_token("alice")
    client = SSEClient(a.base_url, token)
    listener = rdb.pubsub()
    try:
        client.hello()
        sid = client.session_id
        listener.subscribe(f"{prefix}:to:mute")  # hears, never answers
        mute_node(rdb, prefix, sid)
        body = client.envelopes.make("PING", "SYSTEM", {"nonce": "x"})
        resp = post_body(b, sid, token, body, within=10)
        assert resp.status_code == 503 and resp.headers["Retry-After"] == "1"
        assert resp.json()["error"]["code"] == "CLUSTER_UNAVAILABLE"
    finally:
        listener.close()
        client.close()


def test_a_202_from_the_holder_means_redis_has_what_the_body_changed(
        make_node: Callable[..., ProtoServer], rdb: redis.Redis, prefix: str) -> None:
    # A holder killed right after its 202 must not leave a 202 for messages no other
    # node knows it received (the client does not send them again): by the 202, the
    # session's state in Redis counts them. An ACK sends nothing back, so nothing else
    # would have written the state.
    a = make_node()
    token = a.issue_token("alice")
    client = SSEClient(a.base_url, token)
    try:
        client.hello()
        sid = client.session_id
        for _ in range(3):
            body = client.envelopes.make("ACK", "SYSTEM", {"seq": "1"})
            resp = post_body(a, sid, token, body)
            assert resp.status_code == 202
            state = orjson.loads(rdb.hget(f"{prefix}:s:{sid}", "state"))
            assert state["upstream_seq"] == int(body["seq"]), (state, body["seq"])
    finally:
        client.close()


def test_a_delivery_queued_on_a_stale_view_reaches_the_holder_the_record_names(
        make_node: Callable[..., ProtoServer], redis_url: str, prefix: str) -> None:
    # A poster read "no one listens" (the old holder), the session was taken over, then
    # the poster queued: the new holder (the one the record names now) is told, and its
    # next beat delivers it; nothing waits for a take-over that already happened.
    from protoflask.cluster.keys import Keys
    from protoflask.cluster.redis_client import connect
    from protoflask.cluster.store import RedisStore

    a = make_node()
    client = WSClient(a.base_url, a.issue_token("alice"))
    try:
        client.hello()
        poster = RedisStore(connect(redis_url), Keys(prefix), "poster-node")
        poster.ttl_ms = 60_000
        poster.queue(client.session_id, orjson.dumps({"name": "send", "args": [note(7)]}))
        assert client.recv_type("NOTE", within=5)["payload"]["n"] == 7
    finally:
        client.close()


def test_a_delivery_confirmed_by_the_holder_is_in_redis(
        make_node: Callable[..., ProtoServer], rdb: redis.Redis, prefix: str) -> None:
    # The holder confirms a delivery from another node (the sender's send_message,
    # send_tool_done... returns True, and a tool call counts as ended there) only once
    # Redis has the message: a holder killed right after confirming must not take it
    # with it. Each NOTE is in the session's window in Redis when send_message returns.
    a, b = make_node(), make_node()
    client = WSClient(a.base_url, a.issue_token("alice"))
    try:
        client.hello()
        sid = client.session_id
        for n in range(20):
            b.send_message(sid, note(n))  # returns once the holder confirmed it
            window = rdb.lrange(f"{prefix}:r:{sid}", -1, -1)
            assert window and b'"n":%d' % n in window[0], (n, window)
            # (read: 16 unread frames fill the test client's queue, its reader stops and
            # never sees the close frame: close() took its 10 s close_timeout)
            assert client.recv_type("NOTE")["payload"]["n"] == n
    finally:
        client.close()


def test_a_202_from_the_holder_means_redis_has_what_the_body_sent_back(
        make_node: Callable[..., ProtoServer], rdb: redis.Redis, prefix: str) -> None:
    # An inline tool (add) answers within the body's own handling: its TOOL_DONE waits
    # for the transport's writer, and the call is no longer open in the state. A holder
    # killed right after its 202 must not take that TOOL_DONE with it (the client does
    # not post the call again, and the next holder would know of no call to end): by
    # the 202 the TOOL_DONE is in the session's window in Redis.
    a = make_node()
    token = a.issue_token("alice")
    client = SSEClient(a.base_url, token)
    try:
        client.hello()
        sid = client.session_id
        for n in range(20):
            body = client.envelopes.make("TOOL_CALL", "USER", {
                "call_id": f"c{n}", "tool": "add", "params": {"a": n, "b": 1}})
            resp = post_body(a, sid, token, body)
            assert resp.status_code == 202
            window = b"".join(rdb.lrange(f"{prefix}:r:{sid}", -3, -1))
            assert b'"call_id":"c%d"' % n in window, (n, window[-300:])
    finally:
        client.close()


def test_a_message_not_yet_stamped_moves_with_the_state_to_the_next_holder(
        make_node: Callable[..., ProtoServer], rdb: redis.Redis, prefix: str) -> None:
    # The state a journal batch writes is the session's when the batch is flushed: a
    # TOOL_CALL answered by an inline tool is closed and its seq seen there while its
    # TOOL_DONE still waits (for credit here; for a busy writer in the soak). If its
    # holder dies then, the next holder must send that TOOL_DONE (the client will not
    # send the call again): the state carries what waits unstamped.
    a, b = make_node(), make_node()
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    resumed: Any = None
    try:
        client.hello(capabilities={"flow_control": {"initial_credit_messages": 1,
                                                    "downstream": True}})
        sid = client.session_id
        client.send("TOOL_CALL", payload={"call_id": "c1", "tool": "add",
                                          "params": {"a": 1, "b": 1}})
        client.recv_type("TOOL_DONE", call_id="c1")  # the one credit
        client.send("TOOL_CALL", payload={"call_id": "c2", "tool": "add",
                                          "params": {"a": 2, "b": 2}})
        client.send("PING", "SYSTEM", {"nonce": "after"})  # control: needs no credit
        client.recv_type("PONG", nonce="after")  # the call is handled; its answer waits
        seen = int(client.received[-1]["seq"])
        wait_for(lambda: b'"upstream_seq":%d' % client.envelopes.last_seq
                 in (rdb.hget(f"{prefix}:s:{sid}", "state") or b""), within=5,
                 what="the state with the call in Redis")
        # a dies now (as far as the cluster can tell: its record names a node that is gone)
        rdb.hset(f"{prefix}:s:{sid}", "node", "gone")
        client.drop()
        resumed = when_served(lambda: WSClient(b.base_url, token, session=sid,
                                               last_seq=seen), within=20)
        resumed.envelopes = client.envelopes
        resumed.send("FLOW_UPDATE", "SYSTEM", {"channel": "AGENT", "add_messages": 10})
        done = resumed.recv_type("TOOL_DONE", within=10, call_id="c2")
        assert done["payload"]["result"] == {"result": 4}, done
        assert int(done["seq"]) == seen + 1
    finally:
        client.close()
        if resumed is not None:
            resumed.close()


def test_a_delivery_the_holder_does_not_confirm_is_kept_for_it_not_an_error(
        make_node: Callable[..., ProtoServer], rdb: redis.Redis, prefix: str) -> None:
    # The holder hears the delivery (PUBLISH reaches it) and never confirms it (it died
    # on it, or is stuck): the sender neither reports it failed nor drops it. A copy
    # waits in the session's inbox for the holder's next beat or the next holder, with
    # the id that makes whichever applies it second skip it (exactly once after the
    # holder died: tests/cluster/test_unconfirmed_delivery.py).
    a, b = make_node(), make_node()
    token = a.issue_token("alice")
    client = WSClient(a.base_url, token)
    listener = rdb.pubsub()
    try:
        client.hello()
        sid = client.session_id
        listener.subscribe(f"{prefix}:to:mute")  # hears, never answers
        mute_node(rdb, prefix, sid)
        b.send_message(sid, note(1))
        queued = [orjson.loads(item) for item in rdb.lrange(f"{prefix}:in:{sid}", 0, -1)]
        assert [item["args"][0]["payload"] for item in queued] == [{"n": 1}]
        assert queued[0]["did"].startswith(b.hub.node_id + ":")
    finally:
        listener.close()
        client.close()
