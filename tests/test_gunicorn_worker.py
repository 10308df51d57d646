"""protoflask/gunicorn_worker.py in this process: what its worker class checks in gunicorn's
master, and the ``-k gevent`` swap. (Serving, the drain and the per-request turn run in
real gunicorn processes: tests/integration/test_gunicorn.py, test_faults.py,
test_reader_fairness.py.)"""

from __future__ import annotations

import logging
import resource
from types import SimpleNamespace

import pytest
from gunicorn.config import Config
from gunicorn.workers import ggevent

from protoflask.gunicorn_worker import GeventWorker, SPARE_FILES, gevent_means_protoflask


def config(**settings: object) -> Config:
    cfg = Config()
    for name, value in settings.items():
        cfg.set(name, value)
    return cfg


def test_several_workers_without_redis_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(SystemExit, match="3 workers configured.*REDIS_URL"):
        GeventWorker.check_config(config(workers=3), logging.getLogger("test"))


def test_several_workers_with_redis_and_one_without_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    GeventWorker.check_config(config(workers=1), logging.getLogger("test"))
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    GeventWorker.check_config(config(workers=4), logging.getLogger("test"))


def test_the_open_files_limit_is_raised_for_worker_connections() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 900  # a soft limit below what 1000 connections need
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        GeventWorker.check_config(config(workers=1, worker_connections=1000),
                                  logging.getLogger("test"))
        wanted = 1000 + SPARE_FILES
        raised = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert raised == (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_dash_k_gevent_means_protoflask_and_nothing_else_is_touched() -> None:
    arbiter = SimpleNamespace(worker_class=ggevent.GeventWorker, log=logging.getLogger("t"))
    gevent_means_protoflask(arbiter)
    assert arbiter.worker_class is GeventWorker
    for other in (ggevent.GeventPyWSGIWorker, GeventWorker):
        arbiter.worker_class = other
        gevent_means_protoflask(arbiter)
        assert arbiter.worker_class is other


def test_a_worker_stops_tracking_the_greenlet_tree_unless_told(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import gevent

    from protoflask.gunicorn_worker import untrack_greenlet_tree

    before = gevent.config.track_greenlet_tree
    try:
        gevent.config.track_greenlet_tree = True
        monkeypatch.setenv("GEVENT_TRACK_GREENLET_TREE", "1")
        untrack_greenlet_tree()
        assert gevent.config.track_greenlet_tree is True
        monkeypatch.delenv("GEVENT_TRACK_GREENLET_TREE")
        untrack_greenlet_tree()
        assert gevent.config.track_greenlet_tree is False
        assert getattr(gevent.spawn(lambda: None), "spawning_stack", None) is None
    finally:
        gevent.config.track_greenlet_tree = before


@pytest.mark.parametrize("skip", [True, False])
def test_a_lane_streams_access_line_is_skipped_only_where_gunicorn_writes_none(
        skip: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The swap point ``gunicorn_worker.SKIP_QUIET_ACCESS``: a stream's access line is
    neither timed nor asked for only where gunicorn's own ``Logger.access`` returns at
    once (its access log off: it reads none of its arguments then); timed and written
    with an access log, or a logger class with an ``access`` of its own."""
    from gunicorn.glogging import Logger

    from protoflask import gunicorn_worker
    from protoflask.gunicorn_worker import RedactingLogger, access_timed

    monkeypatch.setattr(gunicorn_worker, "SKIP_QUIET_ACCESS", skip)
    quiet = RedactingLogger(Config())
    assert quiet.access(None, None, None, None) is None  # off: no argument read
    assert access_timed(quiet) is not skip
    logging_cfg = Config()
    logging_cfg.set("accesslog", "-")
    assert access_timed(RedactingLogger(logging_cfg))

    class OwnAccess(Logger):
        def access(self, *args: object) -> None:
            return None
    assert access_timed(OwnAccess(Config()))
