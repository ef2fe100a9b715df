"""Verdicts from a tune's saved records when the tune itself did not finish (the device time ran out during
confirmation): each search level's metrics, and each confirmation rate pooled over its runs exactly as
`servetune.confirm.rate_result` does (keep-up over the runs together, p99 with a request-resampling 95%
bootstrap interval).

It ran with servetune at commit 234c013, whose confirmation (`ConfirmOptions`, `rate_result`) has since given
way to the head-to-head (`servetune.confirm`): `git checkout 234c013` to run it again.

Usage: python3 pooled.py TUNE_OUT ITL_SLO_MS TTFT_SLO_MS
"""

import json
import sys
from pathlib import Path

import numpy as np

from servetune.confirm import ConfirmOptions, rate_result
from servetune.loadgen import LoadResult
from servetune.metrics import summarize
from servetune.outcome import LevelOutcome
from servetune.search.objective import level_verdict


def levels(directory: Path, slo: dict[str, float]) -> list[LevelOutcome]:
    """Every saved level in `directory`, with the metrics and verdict servetune gives it."""
    out = []
    for index, path in enumerate(sorted(directory.glob("level-*.records.jsonl"))):
        result = LoadResult.load(path)
        metrics = summarize(result)
        short = metrics.errors.get("short", 0)
        reasons = level_verdict(metrics, slo, short)
        out.append(LevelOutcome(name="confirm" if directory.parent.name == "confirm" else "search",
                                rate=result.request_rate, seed=index, passed=not reasons, reasons=reasons,
                                metrics=metrics, server=None, records=path.name, rejected=short, attempts=1))
    return out


def main(out: Path, itl: float, ttft: float) -> None:
    slo = {"itl_p99_ms": itl, "ttft_p99_ms": ttft}
    for trial in sorted((out / "trials").iterdir()):
        print(f"search, {trial.name}:")
        for lv in levels(trial, slo):
            m = lv.metrics
            print(f"  rate {lv.rate:6.2f}  n {m.completed:4d}  p99 ITL {m.p99_itl_ms:7.1f}  "
                  f"p99 TTFT {m.p99_ttft_ms:7.0f}  keep-up {m.keep_up_ratio or 0:.2f}  "
                  f"{'passes' if lv.passed else 'fails: ' + '; '.join(lv.reasons)}")
    rng, opts = np.random.default_rng(0), ConfirmOptions()
    results = {}
    for config in sorted((out / "confirm").iterdir()):
        runs = levels(config, slo)
        results[config.name] = []
        for rate in sorted({lv.rate for lv in runs}):
            at = [lv for lv in runs if lv.rate == rate]
            result = rate_result(rate, at, config, slo, opts, rng)
            results[config.name].append(result)
            p99 = "  ".join(f"{k} {v['value']:.1f} [{v['ci_low']:.1f}, {v['ci_high']:.1f}]" for k, v in result["p99"].items())
            print(f"confirm {config.name} at {rate:.2f} req/s, {len(at)} runs, {result['requests']} requests: "
                  f"{'holds' if result['passed'] else 'fails'}; {p99}; {'; '.join(result['reasons'])}")
    (out / "pooled.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
