"""Launch a vLLM OpenAI-compatible server that only servetune may use, wait until it is ready, and always stop it."""

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import httpx

from servetune.engine._guard import GUARD_PARENT_ENV, GUARD_SCRATCH_ENV, kill_others
from servetune.engine.args import CPU_KVCACHE_SPACE, normalize, to_argv
from servetune.engine.installed import InstalledVllm, probe
from servetune.engine.logfacts import FailureKind, LaunchFailure, StartupFacts, classify_failure, parse_startup
from servetune.engine.ports import release_port, reserve_port
from servetune.interrupt import handle_unhandled_signals
from servetune.private import private_dir

DEFAULT_CPU_KVCACHE_SPACE_GIB = 1
_GUARD = Path(__file__).with_name("_guard.py")
_SERVERSIDE = Path(__file__).with_name("serverside")  # on the server's PYTHONPATH: its access middleware
ACCESS_MIDDLEWARE = "servetune_access.RequireSecret"
SECRET_ENV = "SERVETUNE_SERVER_SECRET"  # serverside/servetune_access.py reads it
SECRET_USER = "servetune"
_PORT_IN_USE = "Address already in use"
LAUNCH_TRIES = 3  # launches that lost their port to another process before ready are tried again
GRACE_S = 8.0  # a server stopped when its work is done: time to shut down before it is killed
STOP_GRACE_S = 2.0  # one stopped by an interrupt (vLLM still starting up ignores SIGTERM until it is up)


class Launchable(Protocol):
    """A server a measurement launches: an `Engine`, a trial's `Server` (real or simulated)."""

    def start(self) -> StartupFacts: ...

    def stop(self) -> None: ...


@contextmanager
def launched(server: Launchable, starting: AbstractContextManager[Any] | None = None) -> Iterator[StartupFacts]:
    """The one way a measurement runs a server: start it (inside `starting`, what is shown while it starts), yield
    its start-up facts, and stop it when the block ends, however it ends. A server that does not start raises
    `EngineFailed`, already stopped."""
    with starting or nullcontext():
        facts = server.start()
    try:
        yield facts
    finally:
        server.stop()


class EngineFailed(RuntimeError):
    """The server did not become ready; `failure` says why."""

    def __init__(self, failure: LaunchFailure):
        super().__init__(f"{failure.kind}: {failure.reason}")
        self.failure = failure


def resolve_args(engine_args: Mapping[str, Any], vllm: InstalledVllm) -> dict[str, Any]:
    """The args as launched. On CPU the KV cache size is always explicit, as `kv_cache_memory_bytes`
    (what VLLM_CPU_KVCACHE_SPACE sets, but fractional GiB too): from `cpu_kvcache_space_gib`, else the
    environment's VLLM_CPU_KVCACHE_SPACE, else 1 GiB (vLLM's own CPU default asks for 92% of RAM and
    fails on a shared machine)."""
    args = normalize(engine_args)
    space = args.pop(CPU_KVCACHE_SPACE, None)
    if vllm.on_cpu and args.get("kv_cache_memory_bytes") is None:
        space = space or float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or DEFAULT_CPU_KVCACHE_SPACE_GIB)
        args["kv_cache_memory_bytes"] = int(float(space) * 2**30)
    return args


class Engine:
    """One vLLM server process group on a free loopback port; a context manager that stops it on exit.

    The server serves only who holds its `secret`, made for this launch: every request, the development routes
    that VLLM_SERVER_DEV_MODE=1 opens for /reset_prefix_cache included, is refused (401) without it
    (serverside/servetune_access.py, loaded with vLLM's --middleware). The secret goes to the server in its
    environment (another user can read a command line, not an environment), and to clients in `base_url`, as
    its user info (`http://servetune:SECRET@127.0.0.1:PORT`), which httpx and aiohttp send as basic
    authentication: whatever reaches the server through `base_url` is let in. `address` is the URL without it.
    """

    def __init__(
        self,
        model: str,
        engine_args: Mapping[str, Any],
        log_path: Path,
        *,
        python: str | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 900.0,
        extra_env: Mapping[str, str] | None = None,
    ):
        self.model = model
        self.python = python or os.environ.get("SERVETUNE_VLLM_PYTHON") or sys.executable
        self.vllm = probe(self.python)
        self.engine_args = resolve_args(engine_args, self.vllm)
        self.log_path = Path(log_path)
        self.host = host
        self.port: int | None = None  # reserved by start()
        self._port_lock: int | None = None
        self.startup_timeout_s = startup_timeout_s
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen | None = None
        self.scratch: Path | None = None  # the server's own temporary directory while it runs
        self.secret = secrets.token_urlsafe(32)

    @property
    def address(self) -> str:
        """The server's URL, without its secret."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The server's URL with its secret as user info: what servetune's clients send requests to."""
        return f"http://{SECRET_USER}:{self.secret}@{self.host}:{self.port}"

    def argv(self) -> list[str]:
        return [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--host", self.host, "--port", str(self.port),
            "--middleware", ACCESS_MIDDLEWARE, *to_argv(self.engine_args),
        ]

    def env(self) -> dict[str, str]:
        """The server's environment: this one's, vLLM's settings, `extra_env`, the access middleware's directory and
        secret, and its own temporary directory, `scratch` (which nothing overrides): vLLM's file store
        (vllm_dist_*) and IPC sockets go there, and with it once the server stops; torch's compile cache is shared
        by every launch (`compile_cache`)."""
        env = dict(os.environ)
        env.update({"VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                    "PYTHONUNBUFFERED": "1", "TORCHINDUCTOR_CACHE_DIR": compile_cache()})
        if self.vllm.on_cpu:
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override kv_cache_memory_bytes
        env.update(self.extra_env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_SERVERSIDE), env.get("PYTHONPATH")]))
        env[SECRET_ENV] = self.secret
        if self.scratch is not None:
            env["TMPDIR"] = env[GUARD_SCRATCH_ENV] = str(self.scratch)
        return env

    def start(self) -> StartupFacts:
        """Launch on a reserved port and wait for /health; raises EngineFailed (server stopped) if it never
        gets ready, and stops the server before any other exception (an interrupt) goes on. A launch whose port
        another process took first is retried on a new port."""
        handle_unhandled_signals()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        for attempt in range(LAUNCH_TRIES):
            try:
                self._launch()
                failure = self._wait_ready(started)
            except BaseException:  # an interrupt while it starts: the server goes with it
                self.stop()
                raise
            if failure is None:
                break
            self.stop()
            if _PORT_IN_USE not in failure.reason or attempt == LAUNCH_TRIES - 1:
                raise EngineFailed(failure)
        facts = parse_startup(self.log_text())
        return StartupFacts(**{**facts.to_dict(), "ready_s": round(time.monotonic() - started, 2)})

    def _launch(self) -> None:
        self.port, self._port_lock = reserve_port(self.host)
        self.scratch = Path(tempfile.mkdtemp(prefix="vllm-"))  # short: vLLM's socket paths in it are at most 107
        with open(self.log_path, "wb") as log:
            log.write(("$ " + " ".join(self.argv()) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, str(_GUARD), *self.argv()],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env() | {GUARD_PARENT_ENV: str(os.getpid())}, cwd="/", start_new_session=True,
            )

    def _wait_ready(self, started: float) -> LaunchFailure | None:
        assert self.proc is not None  # started
        while time.monotonic() - started < self.startup_timeout_s:
            if self.proc.poll() is not None:
                time.sleep(0.5)  # let the last lines reach the log
                kind, reason = classify_failure(self.log_text())
                return LaunchFailure(kind, reason, str(self.log_path))
            if self._healthy(timeout_s=2.0):
                return None
            time.sleep(0.5)
        return LaunchFailure(FailureKind.TIMEOUT, f"not ready after {self.startup_timeout_s:.0f} s",
                             str(self.log_path))

    def alive(self) -> bool:
        """The server runs and answers /health: vLLM's API server outlives a dead engine core for a while,
        answering 503 until it exits."""
        return self.proc is not None and self.proc.poll() is None and self._healthy(timeout_s=10.0)

    def _healthy(self, timeout_s: float) -> bool:
        """/health answers 200."""
        try:
            return httpx.get(self.base_url + "/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        """Stop the whole process group: TERM (the guard forwards it), then KILL after GRACE_S, or STOP_GRACE_S while
        an interrupt unwinds (a KeyboardInterrupt being handled: servetune exits within a supervisor's 5 s); then
        remove its temporary directory."""
        grace_s = STOP_GRACE_S if isinstance(sys.exc_info()[1], KeyboardInterrupt) else GRACE_S
        proc, self.proc = self.proc, None
        lock, self._port_lock = self._port_lock, None
        scratch, self.scratch = self.scratch, None
        if proc is not None:
            _kill_group(proc, grace_s)
        if lock is not None:  # the port is free for others once its server is gone (or never started)
            assert self.port is not None  # reserved with the lock
            release_port(self.port, lock)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _kill_group(proc: subprocess.Popen, grace_s: float) -> None:
    """TERM the group led by `proc`, wait up to `grace_s` for it, then KILL what is left, and remove the shared
    memory it mapped (`_guard.kill_others`)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    kill_others(proc.pid)
    proc.wait()


def compile_cache() -> str:
    """torch's compile cache: the user's TORCHINDUCTOR_CACHE_DIR, else this user's own directory
    (`servetune.private`), shared by every launch. Not torch's default, TMPDIR/torchinductor_USER: a neighbour can
    take that name first (or swap it, in a TMPDIR of theirs), read what it holds and plant kernels the server
    loads."""
    if given := os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return given
    with private_dir("torchinductor") as cache:
        return str(cache.path)
