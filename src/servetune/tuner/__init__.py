"""The tuner: a study's ask → trial → tell loop within the time limit (`loop`), the loop that hands trials to an
executor (`dispatch`), and the head-to-head against vLLM's defaults (`confirm`)."""

from servetune.tuner.loop import TuneOptions, tune

__all__ = ["TuneOptions", "tune"]
