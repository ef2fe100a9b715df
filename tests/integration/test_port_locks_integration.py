"""The port locks across processes: a second user neither shares nor reaches the first's, a killed servetune's lock
file is swept by the next reservation, and `servetune` refuses a lock directory that is not this user's alone; a
servetune process keeps torch's compile cache in this user's own directory."""

import os
import subprocess
import sys

import pytest

from servetune.engine.ports import port_locks, release_port, reserve_port
from support.paths import ROOT


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become a second user")
@pytest.mark.integration
def test_a_second_user_neither_shares_nor_reaches_the_first_users_locks():
    """root holds a port; a forked child that became `nobody` reserves and releases ports in a directory of its
    own, and can neither list root's directory nor remove root's lock file."""
    port, fd = reserve_port()
    mine = port_locks()
    try:
        child = os.fork()
        if child == 0:  # the child reports through its exit status only
            try:
                os.setgid(65534)
                os.setuid(65534)
                other, other_fd = reserve_port()
                theirs = port_locks()
                release_port(other, other_fd)
                try:
                    os.listdir(mine)
                    os._exit(3)
                except PermissionError:
                    pass
                try:
                    os.unlink(mine / f"{port}.lock")
                    os._exit(5)
                except PermissionError:
                    pass
                os._exit(0 if theirs != mine else 6)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert (mine / f"{port}.lock").exists()
    finally:
        release_port(port, fd)


@pytest.mark.integration
def test_the_lock_file_of_a_killed_servetune_is_swept_by_the_next_reservation():
    """A process killed while holding a port leaves its file (unlocked); the next reservation removes it."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        port, _ = reserve_port()
        os.write(write, str(port).encode())
        os.kill(os.getpid(), 9)  # holding the lock
    os.waitpid(child, 0)
    os.close(write)
    stale = port_locks() / f"{int(os.read(read, 16))}.lock"
    os.close(read)
    assert stale.exists()
    port, fd = reserve_port()
    try:
        assert not stale.exists()
    finally:
        release_port(port, fd)


@pytest.mark.integration
def test_a_tune_whose_lock_directory_is_not_its_own_is_refused_in_one_line_before_any_work(tiny_model, tmp_path):
    """A neighbour's `TMPDIR/servetune-UID` (here: one open to everyone): `servetune tune` exits 2 naming it, with
    nothing made in --out."""
    shared = tmp_path / "shared"
    (shared / f"servetune-{os.geteuid()}").mkdir(parents=True)
    (shared / f"servetune-{os.geteuid()}").chmod(0o777)
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"} | {"TMPDIR": str(shared)}
    proc = subprocess.run([sys.executable, "-m", "servetune", "tune", "--model", str(tiny_model), "--workload",
                           str(ROOT / "examples" / "chat.yaml"), "--slo", "tpot_p99_ms=50", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        f"error: {shared}/servetune-{os.geteuid()} is not a directory of this user's alone (owner uid "
        f"{os.geteuid()}, mode 0777): remove it, or set TMPDIR to a directory of yours"]
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_importing_torch_leaves_no_compile_cache_in_the_temporary_directory(tiny_model, tmp_path):
    """Importing torch (here for the tokenizer) makes TMPDIR/torchinductor_USER and points TORCHINDUCTOR_CACHE_DIR at
    it; a launch from that process took it for the user's choice, so a neighbour could read and plant the kernels the
    server loads. servetune's process keeps the cache in this user's own directory before anything imports torch."""
    shared = tmp_path / "shared"
    shared.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "XDG_RUNTIME_DIR")}
    proc = subprocess.run([sys.executable, "-m", "servetune", "bench", "--base-url", "http://127.0.0.1:9", "--model",
                           str(tiny_model), "--input-len", "8", "--output-len", "4", "--num-prompts", "2", "--json",
                           str(tmp_path / "o.json")], capture_output=True, text=True, env=env | {"TMPDIR": str(shared)},
                          timeout=120)
    assert "cannot reach an OpenAI-compatible server" in proc.stderr  # past the tokenizer
    assert sorted(p.name for p in shared.iterdir()) == [f"servetune-{os.geteuid()}"]
    assert sorted(p.name for p in (shared / f"servetune-{os.geteuid()}").iterdir()) == ["torchinductor"]
