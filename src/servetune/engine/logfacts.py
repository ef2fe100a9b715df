"""Facts read from a vLLM server log: start-up figures and, when it failed, why."""

import re
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class FailureKind(StrEnum):
    """Why a server did not become ready, or a trial has no usable measurement."""

    OOM = "oom"
    KV_CACHE_TOO_SMALL = "kv_cache_too_small"
    INVALID_CONFIG = "invalid_config"
    IMPORT_ERROR = "import_error"
    TIMEOUT = "timeout"
    EXITED = "exited"
    DIED = "died"  # the server died during the load levels
    REJECTS_WORKLOAD = "rejects_workload"  # the config refuses or cuts short part of the workload
    NOT_VLLM = "not_vllm"  # the server does not answer as vLLM does


@dataclass(frozen=True)
class StartupFacts:
    """What vLLM logged while starting; None where the log did not say."""

    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_model_len: int | None = None
    weights_load_s: float | None = None
    compile_s: float | None = None
    init_engine_s: float | None = None
    ready_s: float | None = None  # measured by servetune: launch to /health OK

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LaunchFailure:
    """A server that never became ready: the kind, a one-line reason and the log it wrote."""

    kind: FailureKind
    reason: str
    log_path: str | None = None

    def to_dict(self) -> dict:
        return {"kind": str(self.kind), "reason": self.reason, "log_path": self.log_path}


_NUM = r"([\d,]+)"
_KV = re.compile(rf"KV cache size: {_NUM} tokens")
_CONC = re.compile(rf"Maximum concurrency for {_NUM} tokens per request: ([\d.]+)x")
_WEIGHTS = re.compile(r"Loading weights took ([\d.]+) s")
_COMPILE = re.compile(r"torch\.compile took ([\d.]+) s in total")
_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)")

_FAILURES: list[tuple[FailureKind, re.Pattern]] = [
    (FailureKind.KV_CACHE_TOO_SMALL, re.compile(
        r"To serve at least one request with the model's max seq len.*|No available memory for the cache blocks.*")),
    (FailureKind.OOM, re.compile(
        r".*(?:CUDA out of memory|OutOfMemoryError|Cannot allocate memory|MemoryError|"
        r"is less than desired CPU memory utilization|less than requested memory for kv).*")),
    (FailureKind.IMPORT_ERROR, re.compile(r"(?:ModuleNotFoundError|ImportError): .*")),
    (FailureKind.INVALID_CONFIG, re.compile(r"(?<=Value error, ).*?(?= \[type=|$)")),
    (FailureKind.INVALID_CONFIG, re.compile(
        r".*(?:error: (?:argument|unrecognized arguments).*|ValidationError.*|ValueError: .*)")),
]
_ERROR_LINE = re.compile(r"^\S*(?:Error|Exception)\b.*|.*\b\w+Error: .*")
_LOG_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]*\] )?")


def _num(text: str) -> int:
    return int(text.replace(",", ""))


def parse_startup(log: str) -> StartupFacts:
    """Start-up facts from the text of a vLLM server log."""
    kv = _KV.search(log)
    conc = _CONC.search(log)
    facts: dict[str, Any] = {
        "kv_cache_tokens": _num(kv.group(1)) if kv else None,
        "max_concurrency": float(conc.group(2)) if conc else None,
        "max_model_len": _num(conc.group(1)) if conc else None,
    }
    for key, pattern in (("weights_load_s", _WEIGHTS), ("compile_s", _COMPILE), ("init_engine_s", _INIT)):
        found = pattern.search(log)
        facts[key] = float(found.group(1)) if found else None
    return StartupFacts(**facts)


def _clean(line: str) -> str:
    return _LOG_PREFIX.sub("", line.strip())[:400]


def classify_failure(log: str) -> tuple[FailureKind, str]:
    """The kind of start-up failure and the log line that says it (EXITED with the last error line)."""
    lines = [_clean(line) for line in log.splitlines()]
    for kind, pattern in _FAILURES:
        for line in reversed(lines):
            found = pattern.search(line)
            if found:
                return kind, found.group(0).strip()
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    return FailureKind.EXITED, errors[-1] if errors else (lines[-1] if lines else "no output")
