"""Launch vLLM servers, read what they log and expose, and stop them whatever happens."""

from servetune.engine.args import serve_command, to_argv
from servetune.engine.installed import InstalledVllm, VllmNotFound, probe
from servetune.engine.launcher import Engine, EngineFailed, stop_all
from servetune.engine.logfacts import FailureKind, LaunchFailure, StartupFacts

__all__ = [
    "Engine", "EngineFailed", "FailureKind", "InstalledVllm", "LaunchFailure", "StartupFacts",
    "VllmNotFound", "probe", "serve_command", "stop_all", "to_argv",
]
