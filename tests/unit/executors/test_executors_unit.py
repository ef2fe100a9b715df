"""What one executor does, in the test's own process: `Inline` runs the trial inside submit with its progress
callbacks; a reserved port is not handed out again; a Ray cluster that refuses this machine says a token is in play.
The local worker pool's own: tests/integration/test_executors.py."""

from pathlib import Path

import pytest

from servetune.engine.ports import release_port, reserve_port
from servetune.errors import ServetuneError
from servetune.executors import Inline, make_executor
from servetune.study.outcome import TrialOutcome, TrialStatus
from servetune.trial.hooks import Hooks
from support.pool import job


def test_a_reserved_port_is_not_handed_out_again(monkeypatch):
    port, lock = reserve_port()
    offered = iter([port, port, port + 1 if port < 65535 else port - 1])
    monkeypatch.setattr("servetune.engine.ports.free_port", lambda host: next(offered))
    try:
        other, other_lock = reserve_port()
        assert other != port
        release_port(other, other_lock)
    finally:
        release_port(port, lock)


def test_inline_runs_the_trial_inside_submit_with_its_progress_callbacks(monkeypatch):
    calls = []

    def run_trial(plan, config, out_dir, *, trial_time=None, hooks=None) -> TrialOutcome:
        calls.append((plan, config, out_dir, hooks))
        return TrialOutcome(status=TrialStatus.OK, config=config)

    monkeypatch.setattr("servetune.executors.inline.run_trial", run_trial)
    hooks = Hooks()
    inline = make_executor(1, None, hooks)
    assert isinstance(inline, Inline) and inline.slots == 1
    future = inline.submit(job(0, max_num_seqs=8))
    assert future.done() and future.result() == TrialOutcome(status=TrialStatus.OK, config={"max_num_seqs": 8})
    assert calls == [(None, {"max_num_seqs": 8}, Path("/nonexistent"), hooks)]


def test_a_ray_cluster_that_refuses_this_machine_says_a_token_is_in_play(monkeypatch, tmp_path):
    """Any local ray.init() since Ray 2.59 leaves ~/.ray/auth_token, which turns token authentication on: a
    cluster started without that token refuses to be joined, and the one line says where the token is."""
    import ray

    from servetune.executors.cluster import RayCluster

    def refuse(**kwargs):
        raise ConnectionError("Could not connect to the GCS at 10.0.0.9:6379 after 20 s\nmore lines")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ServetuneError) as plain:
        RayCluster("10.0.0.9:6379")
    assert str(plain.value) == ("--ray-address 10.0.0.9:6379: cannot join the Ray cluster: Could not connect to the "
                                "GCS at 10.0.0.9:6379 after 20 s")
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("a-token")
    with pytest.raises(ServetuneError, match=rf"token authentication on: {tmp_path}/.ray/auth_token; the cluster "
                                             "must use the same token"):
        RayCluster("10.0.0.9:6379")
