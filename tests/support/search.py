"""An installed vLLM's flags as the search sees them (on CPU and on CUDA), the search space of the tests, and a trial
told to a study as a strategy would see it."""

from optuna.trial import TrialState

from servetune.engine.installed import InstalledVllm
from servetune.search.space import build_space
from servetune.search.strategies import suggest
from servetune.study.record import read_trial, write_trial
from support import outcomes

FLAGS = {name: {"kind": "value", "default": None, "choices": None} for name in (
    "max_num_batched_tokens", "max_model_len", "max_num_seqs", "gpu_memory_utilization", "block_size")}
FLAGS |= {name: {"kind": "bool", "default": None, "choices": None} for name in (
    "enable_chunked_prefill", "enable_prefix_caching", "enforce_eager")}
CPU = InstalledVllm("0.32.0", "cpu", FLAGS)
GPU = InstalledVllm("0.24.0", "cuda", FLAGS)
SPACE = build_space(CPU, 1000, context=4096)


def _tell(study, value=None, preemptions=0, failed=False):
    """A trial asked of `study` (vLLM's defaults, or the strategy's config from SPACE), stored with an OOM when
    `failed`, else with `preemptions`, and told `value`: its config."""
    trial = study.ask()
    params = suggest(trial, SPACE) if read_trial(trial).role != "default" else {}
    out = outcomes.failed(kind="oom") if failed else outcomes.ok(preemptions=preemptions)
    write_trial(trial, outcome=out)
    if failed:
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, value)
    return params
