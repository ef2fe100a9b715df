"""`launched`: the one way a measurement runs a server, stopped however its block ends."""

import pytest

from servetune.engine import EngineFailed, FailureKind, LaunchFailure, StartupFacts, launched


class Server:
    def __init__(self, fails: bool = False):
        self.fails, self.calls = fails, []

    def start(self) -> StartupFacts:
        self.calls.append("start")
        if self.fails:
            raise EngineFailed(LaunchFailure(FailureKind.OOM, "out of memory", "server.log"))
        return StartupFacts(ready_s=1.5)

    def stop(self) -> None:
        self.calls.append("stop")


class Starting:
    def __init__(self, calls: list[str]):
        self.calls = calls

    def __enter__(self):
        self.calls.append("shown")

    def __exit__(self, *exc):
        self.calls.append("hidden")


def test_the_block_gets_the_start_up_facts_and_the_server_is_stopped_after_it():
    server = Server()
    with launched(server, Starting(server.calls)) as facts:
        server.calls.append("measured")
    assert facts.ready_s == 1.5
    assert server.calls == ["shown", "start", "hidden", "measured", "stop"]


@pytest.mark.parametrize("stop", [RuntimeError("a level broke"), KeyboardInterrupt()])
def test_the_server_is_stopped_whatever_ends_the_block(stop):
    server = Server()
    with pytest.raises(type(stop)), launched(server):
        raise stop
    assert server.calls == ["start", "stop"]


def test_a_server_that_does_not_start_never_enters_the_block():
    server = Server(fails=True)
    with pytest.raises(EngineFailed, match="out of memory"), launched(server):
        server.calls.append("measured")
    assert server.calls == ["start"]  # Engine.start stops what it launched before it raises
