"""What the installed vLLM accepts: its version, platform and server flags, read from vLLM itself."""

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from servetune.device import DeviceKind
from servetune.errors import ServetuneError
from servetune.private import private_dir


class VllmNotFound(ServetuneError):
    """The Python that should run vLLM cannot import it."""


@dataclass(frozen=True)
class InstalledVllm:
    """The installed vLLM: version, device type ('cpu', 'cuda', ...), flags by snake_case name, and the
    device's total memory, name and the number of devices visible, as vLLM sees them (None/""/0 where the
    platform cannot tell; 0 on CPU)."""

    version: str
    device_type: str
    flags: dict[str, dict[str, Any]]
    device_memory_bytes: int | None = None
    device_name: str = ""
    device_count: int = 0

    @property
    def on_cpu(self) -> bool:
        return self.device_type == "cpu"

    @property
    def kind(self) -> DeviceKind:
        return DeviceKind.of(self.on_cpu)

    def accepts(self, name: str) -> bool:
        return name.replace("-", "_") in self.flags


@cache
def probe(python: str = sys.executable) -> InstalledVllm:
    """Ask `python` (which must have vLLM) for its vLLM's version, platform and server flags (~7-10 s: it imports
    vLLM). A CPU build's answer is kept in this user's own directory (`servetune.private`), keyed by the interpreter,
    vLLM's package files and the VLLM_* environment (`_probe_key`), and read back by the next servetune; a GPU's is
    asked every time (its memory, devices and MIG slices can change under the same install)."""
    key = _probe_key(python)
    if key is not None and (kept := _kept(key)) is not None:
        return kept
    script = Path(__file__).with_name("_probe.py")
    proc = subprocess.run(
        [python, str(script)], capture_output=True, text=True, cwd="/", timeout=300
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise VllmNotFound(f"cannot read vLLM's engine arguments with {python}: {last}")
    data = json.loads(proc.stdout)
    vllm = InstalledVllm(data["vllm_version"], data["device_type"], data["flags"], data.get("device_memory_bytes"),
                         data.get("device_name", ""), data.get("device_count", 0))
    if key is not None and vllm.on_cpu:
        _keep(key, vllm)
    return vllm


_FIND = "import importlib.util as u; s = u.find_spec('vllm'); print(s.origin if s and s.origin else '')"


def _probe_key(python: str) -> str | None:
    """What a probe's answer depends on, hashed: the interpreter, where its vLLM lies and when its files were last
    written (a reinstall or an upgrade rewrites them), and the VLLM_* variables; None where vLLM is not found
    without importing it."""
    try:
        found = subprocess.run([python, "-c", _FIND], capture_output=True, text=True, cwd="/", timeout=60)
        origin = Path(found.stdout.strip())
        if found.returncode != 0 or not origin.is_file():
            return None
        files = [Path(python).resolve(), origin, origin.parent, *sorted(origin.parent.glob("*version*.py"))]
        stamps = [(str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files]
    except (OSError, subprocess.SubprocessError):
        return None
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("VLLM_"))
    return hashlib.sha256(json.dumps([stamps, env]).encode()).hexdigest()[:32]


def _kept(key: str) -> InstalledVllm | None:
    """A probe's answer kept under `key`, or None."""
    try:
        with private_dir("probes") as kept:
            fd = kept.open(f"{key}.json", os.O_RDONLY)
            with os.fdopen(fd) as f:
                return InstalledVllm(**json.load(f))
    except (OSError, ServetuneError, ValueError, TypeError):
        return None


def _keep(key: str, vllm: InstalledVllm) -> None:
    """Keep a probe's answer under `key` (written whole, or not at all)."""
    with contextlib.suppress(OSError, ServetuneError), private_dir("probes") as kept:
        tmp = f".{key}.{os.getpid()}.tmp"
        with os.fdopen(kept.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
            json.dump(asdict(vllm), f)
        os.rename(tmp, f"{key}.json", src_dir_fd=kept.fd, dst_dir_fd=kept.fd)
