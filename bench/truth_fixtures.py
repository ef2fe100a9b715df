"""The test fixture of real long-reply levels (tests/unit/measure/test_truth_fixtures.py) from a
`bench/goodput_truth.sh` run: the tune's capacity level (a closed loop, every token's time), vLLM's client's levels at
the rates it measured (each request's send, first token, end and reply length) and what `bench/goodput_truth.py`
found there. Times are microseconds from the level's first send; a capacity level's token times are the gaps between
them, in 100 us.
With --tune-levels, the tune's levels of those numbers instead of its capacity level, each with every token's time
(`tests/unit/measure/test_truth_fixtures.py` decides them again).

usage: .venv/bin/python bench/truth_fixtures.py TRUTH_DIR OUT.json.gz [--tune-levels N ...]
"""

import argparse
import gzip
import json
from pathlib import Path

from goodput_truth import records_of

from servetune.loadgen.records import LoadResult, RequestRecord


def timed(path: Path) -> list[RequestRecord]:
    """A records file's timed requests."""
    return _timed(LoadResult.load(path))


def _timed(load: LoadResult) -> list[RequestRecord]:
    return [r for r in load.records if not r.warmup]


def with_tokens(records: list[RequestRecord]) -> dict:
    """Records with every token's time: [send, [gaps from the send, 100 us], end, error] in us from the first send."""
    t0 = min(r.start_ns for r in records)
    rows = []
    for r in records:
        stamps = [r.start_ns, *r.chunk_ns]
        gaps = [round((b - a) / 1e5) for a, b in zip(stamps, stamps[1:])]
        rows.append([round((r.start_ns - t0) / 1e3), gaps, round((r.end_ns - t0) / 1e3), r.error])
    return {"records": rows, "mean_output": sum(r.expected_output_len for r in records) / len(records)}


def client_level(path: Path) -> list[list]:
    """vLLM's client's detailed results (`goodput_truth.records_of`): [send, first token, end, output tokens] in us
    from the first send."""
    records = records_of(json.loads(path.read_text()))
    t0 = min(r.start_ns for r in records)
    return [[round((r.start_ns - t0) / 1e3), round((r.chunk_ns[0] - t0) / 1e3), round((r.end_ns - t0) / 1e3),
             r.output_tokens] for r in records]


def tune_level(path: Path) -> dict:
    """A tune's level at a finite rate: its rate and timed records with every token's time."""
    load = LoadResult.load(path)
    return {"rate": load.request_rate, **with_tokens(_timed(load))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("truth_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tune-levels", type=int, nargs="+", default=[], metavar="N")
    args = parser.parse_args()
    truth_dir, out, tune_levels = args.truth_dir, args.out, args.tune_levels
    truth = json.loads((truth_dir / "truth" / "truth.json").read_text())
    trial = truth_dir / "tune" / "trials" / "0000"
    fixture = {
        "source": f"{truth_dir} ({truth['command']})",
        "slo": truth["slo"], "truth": truth["truth"],
        "rows": [{k: row.get(k) for k in ("rate", "held", "p99", "keep_up_ratio", "window_s")}
                 for row in truth["rows"]],
    }
    if tune_levels:
        fixture["tune_levels"] = [tune_level(trial / f"level-{n:02d}.records.jsonl") for n in tune_levels]
    else:
        fixture["capacity_level"] = with_tokens(timed(trial / "level-00.records.jsonl"))
        fixture["levels"] = {f"{row['rate']:.3f}": client_level(truth_dir / "truth" / f"rate-{row['rate']:.3f}"
                                                                ".vllm-bench.json") for row in truth["rows"]}
    out.write_bytes(gzip.compress(json.dumps(fixture, separators=(",", ":")).encode(), mtime=0))
    print(f"{out}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
