"""Launch vLLM servers, read what they log and expose, and stop them whatever happens."""

from servetune.engine.args import serve_command, to_argv
from servetune.engine.installed import InstalledVllm, VllmNotFound, probe
from servetune.engine.launcher import Engine, EngineFailed, Launchable, launched
from servetune.engine.logfacts import FailureKind, LaunchFailure, StartupFacts

__all__ = [
    "Engine", "EngineFailed", "FailureKind", "InstalledVllm", "LaunchFailure", "Launchable", "StartupFacts",
    "VllmNotFound", "launched", "probe", "serve_command", "to_argv",
]
