"""The server a trial measures, behind a small protocol (`Server`): start it, check it against the workload, send
it load levels, stop it. `VllmServer` is the real one (a vLLM process, levels over HTTP); the simulated engine
(`servetune.testing.simengine`) keeps the same protocol on a simulated clock."""

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx

from servetune.engine import Engine, StartupFacts
from servetune.engine.logfacts import FailureKind
from servetune.loadgen import LoadShape, RequestRecord, Target
from servetune.measure.bench import LevelResult, measure_level
from servetune.study.outcome import Failure
from servetune.workload import RequestSpec


class Server(Protocol):
    """One launched engine with a config."""

    engine_args: dict[str, Any]  # the config as launched
    log_path: Path

    def start(self) -> StartupFacts:
        """Launch and wait until it serves; `EngineFailed` (with the failure as data) when it does not start."""
        ...

    def preflight(self, requests: Sequence[RequestSpec]) -> Failure | None:
        """Why the running server cannot serve these requests as asked (`rejects_workload`), or None."""
        ...

    def level(self, requests: Sequence[RequestSpec], shape: LoadShape,
              on_record: Callable[[RequestRecord], None] | None,
              should_stop: Callable[[Sequence[RequestRecord]], bool]) -> LevelResult:
        """One load level, the server's caches emptied first (no level is helped by another's prompts)."""
        ...

    def alive(self) -> bool: ...

    def stop(self) -> None: ...


class VllmServer:
    """A real vLLM server (`servetune.engine.Engine`, launched by `start`) and levels sent to it over HTTP."""

    def __init__(self, engine: Engine, endpoint: Literal["completions", "chat"]):
        self.engine, self.model, self.endpoint = engine, engine.model, endpoint
        self.engine_args, self.log_path = engine.engine_args, engine.log_path

    def start(self) -> StartupFacts:
        return self.engine.start()

    def preflight(self, requests: Sequence[RequestSpec]) -> Failure | None:
        return preflight(self.engine.base_url, self.model, self.endpoint, requests)

    def level(self, requests: Sequence[RequestSpec], shape: LoadShape,
              on_record: Callable[[RequestRecord], None] | None,
              should_stop: Callable[[Sequence[RequestRecord]], bool]) -> LevelResult:
        reset_prefix_cache(self.engine.base_url)
        target = Target(self.engine.base_url, self.model, self.endpoint)
        return measure_level(target, requests, shape, on_record=on_record, should_stop=should_stop)

    def alive(self) -> bool:
        return self.engine.alive()

    def stop(self) -> None:
        self.engine.stop()


def preflight(base_url: str, model: str, endpoint: Literal["completions", "chat"], requests: Sequence[RequestSpec],
              probes: int = 2) -> Failure | None:
    """Check the workload against the running server before any level: every request must fit the server's
    max-model-len (`RequestSpec.min_model_len`), and the `probes` longest are sent for real and must come back
    whole. Returns the failure (kind `rejects_workload`) naming how much of the workload the config rejects, one
    (`not_vllm`) naming what a server that does not answer as vLLM does answered, or None."""
    try:
        tokenized = httpx.post(f"{base_url}/tokenize", json={"model": model, "prompt": "fit"}, timeout=60)
        model_len = _field(tokenized, "max_model_len")
        if not isinstance(model_len, int):
            return not_vllm(f"/tokenize gave HTTP {tokenized.status_code} without max_model_len: "
                            f"{tokenized.text[:200]}")
        over = [r for r in requests if r.min_model_len > model_len]
        if over:
            return rejects(len(over), len(requests), f"they need max-model-len up to "
                           f"{max(r.min_model_len for r in over)}, the server has {model_len}")
        for r in sorted(requests, key=lambda r: r.min_model_len)[-probes:]:
            if problem := _probe(base_url, model, endpoint, r, model_len, probes):
                return problem
    except httpx.HTTPError as e:
        return Failure(kind=FailureKind.EXITED, reason=f"the server stopped answering before the first level: {e}")
    return None


def _field(response: httpx.Response, *keys: str) -> object:
    """The value at `keys` in a JSON answer; None where the answer is not JSON or lacks it."""
    try:
        value = response.json()
        for key in keys:
            value = value[key]
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    return value


def not_vllm(what: str) -> Failure:
    """The failure of a server that answers otherwise than vLLM: `what` it answered."""
    return Failure(kind=FailureKind.NOT_VLLM, reason=f"the server does not answer as vLLM does: {what}")


def rejects(n: int, total: int, why: str) -> Failure:
    """The failure of a config that refuses `n` of `total` requests of the workload, and why."""
    return Failure(kind=FailureKind.REJECTS_WORKLOAD, reason=f"config rejects {100 * n / total:.1f}% of the workload "
                   f"({n} of {total} requests): {why}", rejected_fraction=n / total)


def _probe(base_url: str, model: str, endpoint: str, request: RequestSpec, model_len: int,
           probes: int) -> Failure | None:
    """Send one request (one of `probes`) for real, whole; the failure of a server that did not serve it as asked,
    or None."""
    if endpoint == "chat":
        path, body = "/v1/chat/completions", {"messages": request.messages(),
                                              "max_completion_tokens": request.output_len}
    else:
        path, body = "/v1/completions", {"prompt": request.prompt, "max_tokens": request.output_len}
    response = httpx.post(base_url + path, json={"model": model, "ignore_eos": True, **body}, timeout=600)
    needs = f"(it needs {request.min_model_len} of {model_len} tokens)"
    if response.status_code != 200:
        return rejects(1, probes, f"the server refused a {request.prompt_len}-token prompt: HTTP "
                                  f"{response.status_code} {response.text[:200]} {needs}")
    got = _field(response, "usage", "completion_tokens")
    if not isinstance(got, int):
        return not_vllm(f"{path} answered without usage.completion_tokens: {response.text[:200]}")
    if got < request.output_len:
        return rejects(1, probes, f"the server cut a reply to {got} of {request.output_len} tokens {needs}")
    return None


def reset_prefix_cache(base_url: str) -> None:
    """Empty the prefix cache (needs VLLM_SERVER_DEV_MODE=1, which the launcher sets) so no level is
    helped by the prompts of another; the levels also send fresh prompts."""
    try:
        httpx.post(base_url + "/reset_prefix_cache", timeout=30)
    except httpx.HTTPError:
        pass
