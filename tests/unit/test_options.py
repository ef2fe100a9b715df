"""Each command's options are one model (`servetune.options`): the CLI's command line is built from it, its values are
checked into what the command runs, and no function takes a long list of parameters instead."""

import ast

import pytest
import typer
from typer.testing import CliRunner

from servetune.cli import app
from servetune.options import BenchArgs, DemoArgs, TuneArgs, UsageError
from servetune.trial.run import LevelOptions
from support.paths import EXAMPLES, ROOT

SRC = ROOT / "src" / "servetune"


def test_the_command_line_is_the_models_fields():
    command = typer.main.get_command(app).commands["bench"]
    flags = {name for param in command.params for name in param.opts}
    assert {"--json", "--model", "--base-url", "--engine-arg", "--request-timeout", "--goodput"} <= flags
    assert {param.name for param in command.params} == set(BenchArgs.model_fields)
    tune = typer.main.get_command(app).commands["tune"]
    assert {param.name for param in tune.params} == set(TuneArgs.model_fields)
    assert "TPE" in next(p.help for p in tune.params if p.name == "strategy")  # from the strategies' registry


def test_tune_options_from_the_models_values(tiny_model, tmp_path):
    args = TuneArgs(model=str(tiny_model), workload=EXAMPLES / "chat.yaml", out=tmp_path, slo=["tpot_p99_ms=25"],
                    engine_arg=["max-num-seqs=8"], level_requests=400, time_limit="25m")
    opts = args.resolve()
    assert opts.slo.as_dict() == {"tpot_p99_ms": 25.0} and opts.engine_args == {"max_num_seqs": 8}
    assert opts.levels == LevelOptions(requests=400) and opts.time_limit_s == 1500 and opts.storage is None
    # a TPOT p99 passes at 95% only on >= 299 requests after the fill: 300 could never pass, 304 is the least allowed
    with pytest.raises(UsageError, match=r"--level-requests 300: no level could pass tpot_p99_ms: .* at least 299 "):
        args.model_copy(update={"level_requests": 300}).resolve()
    assert args.model_copy(update={"level_requests": 304}).resolve().levels.requests == 304
    itl = args.model_copy(update={"slo": ["itl_p99_ms=25"], "level_requests": 100})  # ITL counts gaps, not requests
    assert itl.resolve().levels.requests == 100
    with pytest.raises(UsageError, match="--time-limit: "):
        args.model_copy(update={"time_limit": "soon"}).resolve()
    with pytest.raises(UsageError, match="--strategy: unknown strategy 'annealing'; choose from optuna, grid, seed"):
        args.model_copy(update={"strategy": "annealing"}).resolve()
    with pytest.raises(UsageError, match="--request-timeout: 0 is not a positive number"):
        args.model_copy(update={"request_timeout": 0.0}).resolve()


def test_the_demo_is_a_tune_with_its_own_values(tiny_model, tmp_path):
    opts = DemoArgs(out=tmp_path, budget=3).tune(tiny_model, itl_slo_ms=40, time_limit_s=420).resolve()
    assert opts.slo.as_dict() == {"itl_p99_ms": 40.0} and opts.strategy == "optuna" and opts.budget == 3
    assert opts.levels == LevelOptions(requests=400, max_levels=4) and opts.time_limit_s == 420
    assert opts.model == str(tiny_model.resolve()) and opts.references == []
    reference = tmp_path / "small-chunk.yaml"
    reference.write_text("max-num-batched-tokens: 128\n")
    slow = DemoArgs(out=tmp_path, budget=3).tune(tiny_model, itl_slo_ms=120.5, time_limit_s=300,
                                                 reference=reference).resolve()
    assert slow.budget == 2 and slow.slo.as_dict() == {"itl_p99_ms": 120.5}
    assert slow.references == [{"max_num_batched_tokens": 128}]


def test_bench_options_name_the_option_at_fault(tmp_path):
    with pytest.raises(UsageError, match="give exactly one of --base-url URL"):
        BenchArgs(json_out=tmp_path / "r.json", model="m").resolve()
    with pytest.raises(UsageError, match="--burstiness: "):
        BenchArgs(json_out=tmp_path / "r.json", model="m", base_url="http://x", burstiness=0).resolve()
    opts = BenchArgs(json_out=tmp_path / "r.json", model="m", base_url="http://x", num_prompts=5, request_rate=2,
                     goodput=["ttft_ms=500"]).resolve()
    assert (opts.workload.num_requests, opts.workload.request_rate, opts.goodput_slo) == (5, 2.0, {"ttft_ms": 500.0})


def test_a_lost_option_fails_in_one_line():
    result = CliRunner().invoke(app, ["tune", "--model", "m", "--out", "o"])
    assert result.exit_code == 2 and "--workload" in result.output


def test_no_function_takes_more_than_eight_parameters():
    """Where many values travel together they are a model (options, `LoadShape`, `TrialPlan`)."""
    long = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.arg not in ("self", "cls")]
                if len(names) > 8:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({len(names)})")
    assert long == []


@pytest.mark.parametrize(("slo", "what"), [("tpot_p99_ms=50", "TPOT"), ("itl_p99_ms=50", "ITL")])
def test_a_latency_the_workloads_replies_cannot_show_is_refused_with_the_least_reply_that_can(tiny_model, tmp_path,
                                                                                              slo, what):
    """With 1-token replies no request has a TPOT or an inter-token gap: every level was "0 of 0
    requests", p99 TPOT shown 0.0, exit 0 with no rate."""
    (tmp_path / "w.yaml").write_text("num_requests: 50\ninput_len: {type: fixed, value: 32}\n"
                                     "output_len: {type: fixed, value: 1}\n")
    args = TuneArgs(model=str(tiny_model), workload=tmp_path / "w.yaml", out=tmp_path / "out", slo=[slo])
    with pytest.raises(UsageError) as refused:
        args.resolve()
    assert str(refused.value) == (
        f"--slo {slo.partition('=')[0]}: every reply of the workload is 1 token long, and {what} is measured between "
        "a reply's tokens: give the workload's output_len at least 2 tokens, or bound ttft_p99_ms or e2el_p99_ms")
    assert args.model_copy(update={"slo": ["ttft_p99_ms=50"]}).resolve().slo.as_dict() == {"ttft_p99_ms": 50.0}
    (tmp_path / "w.yaml").write_text("num_requests: 50\ninput_len: {type: fixed, value: 32}\n"
                                     "output_len: {type: uniform, min: 1, max: 2}\n")
    assert args.resolve().slo.as_dict() == {slo.partition("=")[0]: 50.0}


def test_a_level_size_that_could_never_decide_an_itl_slo_is_refused_with_the_least_that_can(tiny_model, tmp_path):
    """`--level-requests 1` with an ITL SLO was accepted: a level rests on at least
    --min-level-requests requests, and on enough of their gaps."""
    args = TuneArgs(model=str(tiny_model), workload=EXAMPLES / "chat.yaml", out=tmp_path / "out",
                    slo=["itl_p99_ms=25"], level_requests=1)
    with pytest.raises(UsageError) as refused:
        args.resolve()
    assert str(refused.value) == (
        "--level-requests 1: no level could pass itl_p99_ms: at 95% it passes only on at least 40 requests "
        "(--min-level-requests) counted after the level fills up, and filling it takes more; use at least 140 (the "
        "default is 600)")
    (tmp_path / "w.yaml").write_text("num_requests: 50\ninput_len: {type: fixed, value: 32}\n"
                                     "output_len: {type: fixed, value: 3}\n")
    short = args.model_copy(update={"workload": tmp_path / "w.yaml", "level_requests": 100})
    with pytest.raises(UsageError, match=r"^--level-requests 100: no level could pass itl_p99_ms: at 95% it passes "
                                         r"only on at least 150 requests \(2 gaps each\) counted"):
        short.resolve()


@pytest.mark.parametrize(("given", "message"), [
    ("0.5s", "--time-limit 0.5s: less than vLLM's first launch on a machine takes (~2m00s on a CPU, more on a GPU): "
             "give at least 2m00s"),
    ("99999999999999h", "--time-limit 99999999999999h: more than 7 days: leave --time-limit out for a tune without "
                        "one"),
    ("5m5m", "--time-limit: '5m5m' is not a duration (e.g. 25m, 1h30m, 90s, or seconds; each unit once, hours "
             "before minutes before seconds)"),
])
def test_a_time_limit_that_cannot_hold_a_launch_or_repeats_a_unit_is_refused(tiny_model, tmp_path, given, message):
    """`0.5s` ran 29 s and said "29s of 29s"; `5m5m` was read as 10 minutes; `99999999999999h`
    was taken. The demo's own limit is held to the same least."""
    args = TuneArgs(model=str(tiny_model), workload=EXAMPLES / "chat.yaml", out=tmp_path / "out",
                    slo=["tpot_p99_ms=25"], time_limit=given)
    with pytest.raises(UsageError) as refused:
        args.resolve()
    assert str(refused.value) == message
    assert args.model_copy(update={"time_limit": "2m"}).resolve().time_limit_s == 120
    with pytest.raises(UsageError) as refused:
        DemoArgs(out=tmp_path, time_limit=given).limit_s()
    assert str(refused.value) == message


def test_an_option_whose_metavar_is_its_name_names_its_flag():
    # typer 0.27 (the H200 machine's) reads Option(metavar="MODEL") on a field `model` as the flag --MODEL: `servetune
    # bench --model` was "No such option" there. Such an option names its flag itself.
    tree = ast.parse((SRC / "options.py").read_text())
    unnamed = []
    for field in (n for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)):
        for call in (n for n in ast.walk(field.annotation) if isinstance(n, ast.Call)):
            metavar = next((k.value.value for k in call.keywords if k.arg == "metavar"), None)
            if metavar == field.target.id.upper() and not call.args:
                unnamed.append(field.target.id)
    assert unnamed == []
