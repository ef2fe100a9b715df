"""What the installed vLLM accepts: its version, platform and server flags, read from vLLM itself."""

import json
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from servetune.errors import ServetuneError


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

    def accepts(self, name: str) -> bool:
        return name.replace("-", "_") in self.flags


@cache
def probe(python: str = sys.executable) -> InstalledVllm:
    """Ask `python` (which must have vLLM) for its vLLM's version, platform and server flags (~7 s)."""
    script = Path(__file__).with_name("_probe.py")
    proc = subprocess.run(
        [python, str(script)], capture_output=True, text=True, cwd="/", timeout=300
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise VllmNotFound(f"cannot read vLLM's engine arguments with {python}: {last}")
    data = json.loads(proc.stdout)
    return InstalledVllm(data["vllm_version"], data["device_type"], data["flags"],
                         data.get("device_memory_bytes"), data.get("device_name", ""), data.get("device_count", 0))
