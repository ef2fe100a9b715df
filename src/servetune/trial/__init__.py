"""One trial: launch a config, check the workload fits, measure load levels, stop (`run`); the server it measures
behind a small protocol (`server`); the progress hooks a tune and its trials call (`hooks`)."""

from servetune.trial.hooks import Hooks
from servetune.trial.run import LevelOptions, TrialPlan, run_trial
from servetune.trial.server import Server, VllmServer

__all__ = ["Hooks", "LevelOptions", "Server", "TrialPlan", "VllmServer", "run_trial"]
