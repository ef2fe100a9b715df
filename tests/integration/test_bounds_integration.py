"""Memory and time within bounds whatever the input, in the processes a user runs: a verify --config or an
--engine-arg whose aliases expand without end is one line before anything launches; against tests/fake_server.py's
faults, an HTTP error's endless body is read up to a cap, and a stream that goes on past its max_tokens without ending
fails as `overrun`."""

import subprocess
import sys

import pytest

from servetune.loadgen import LoadShape, Target, run_load_sync
from servetune.loadgen.client import ERROR_BODY_BYTES, EXTRA_CHUNKS
from servetune.workload.request import RequestSpec
from support.bombs import BOMB
from support.paths import EXAMPLES, FAKE_SERVER

SERVETUNE = [sys.executable, "-m", "servetune"]


@pytest.fixture(scope="module")
def fake() -> str:
    """A fake server streaming one token per 20 ms tick."""
    proc = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--token-delay-ms", "20"], stdout=subprocess.PIPE,
                            text=True)
    yield f"http://127.0.0.1:{proc.stdout.readline().split()[1]}"
    proc.kill()
    proc.wait()


@pytest.mark.integration
def test_verify_config_and_engine_arg_bombs_are_one_line_before_anything_launches(tiny_model, tmp_path):
    (tmp_path / "bomb.yaml").write_text(BOMB)
    proc = subprocess.run([*SERVETUNE, "verify", "--config", str(tmp_path / "bomb.yaml"), "--model", str(tiny_model),
                           "--workload", str(EXAMPLES / "chat.yaml"), "--rate", "1", "--json",
                           str(tmp_path / "v" / "v.json")], capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: --config: {tmp_path / 'bomb.yaml'}: cannot read the config: its aliases")
    inline = "x=[" + ", ".join(f"&a{i} [{', '.join([f'*a{i - 1}'] * 10) if i else 'y, y'}]" for i in range(9)) + "]"
    proc = subprocess.run([*SERVETUNE, "bench", "--launch", "--model", str(tiny_model), "--engine-arg", inline,
                           "--json", str(tmp_path / "b.json")], capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "its aliases expand to more than" in lines[0], proc.stderr
    assert not (tmp_path / "v").exists() and not (tmp_path / "b.server.log").exists()


@pytest.mark.integration
@pytest.mark.timeout(60)  # read whole, the endless body would never let the request end
def test_an_http_error_with_an_endless_body_is_read_up_to_a_cap(fake):
    result = run_load_sync(Target(fake, "m"), [RequestSpec("fake:error_body=1", 1, 8), RequestSpec("a b", 2, 8)])
    failed, ok = result.records
    assert failed.error == f"http_500: Internal Server Error {'x' * ERROR_BODY_BYTES}" and ok.ok


@pytest.mark.integration
@pytest.mark.timeout(60)  # the stall timeout fires on silence only: without a bound these streams never end
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("fault", ["endless", "ping"])
def test_a_stream_that_goes_on_past_its_max_tokens_fails_as_overrun(fake, endpoint, fault):
    requests = [RequestSpec(f"fake:{fault}=1", 1, 8), RequestSpec("a b", 2, 8)]
    result = run_load_sync(Target(fake, "m", endpoint), requests, LoadShape(request_timeout_s=30))
    overrun, ok = result.records
    assert overrun.error_kind == "overrun" and "max_tokens 8, and the stream went on" in overrun.error
    assert ok.ok and len(ok.chunk_ns) == (9 if endpoint == "chat" else 8)
    if fault == "endless":  # stopped at the first chunk past max_tokens and the allowance (a role, a last chunk)
        assert len(overrun.chunk_ns) == 8 + EXTRA_CHUNKS + 1
