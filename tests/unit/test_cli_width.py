"""The CLI fits any terminal: at 80 columns, in a terminal or in a log file, the tune's answer prints every config and
the command to run whole (never cut to fit a table's column), and each command's --help keeps every line whole,
with a metavar saying what to type, a help text for every option and an example."""

import io
import json
import re
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

import servetune.console
from servetune.cli import _tune, app, help_text
from servetune.engine.args import to_argv
from servetune.options import TuneArgs
from servetune.study.results import Summary
from support.paths import ROOT

# A real tune's answer (H200, heavy-tailed prompts, two SLOs, 15 minutes): a long model path and a best config of
# seven flags, whose table cut them to "--max-num-…" before.
HEAVY = ROOT / "docs" / "results" / "h200-matrix" / "heavy-15m" / "summary.json"
COMMANDS = [["bench"], ["tune"], ["demo"], ["report"], ["memory"], ["verify"], ["model", "tiny"]]


def committed_summary(path: Path = HEAVY) -> Summary:
    return Summary.model_validate(json.loads(path.read_text()))


@contextmanager
def printed(width: int, terminal: bool):
    """What servetune's console prints meanwhile, at `width` columns, to a terminal or to a file (a log)."""
    out = io.StringIO()
    with mock.patch.object(servetune.console, "console", Console(file=out, width=width, force_terminal=terminal,
                                                                 color_system=None)):
        yield out


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "log file"])
def test_the_answer_at_80_columns_prints_each_config_and_the_command_whole(terminal):
    summary = committed_summary()
    with printed(80, terminal) as out:
        servetune.console.show_answer(summary, Path("out/heavy"))
    lines = out.getvalue().splitlines()
    assert f"run it: {summary.best_command}" in lines  # one line: a terminal wraps it, a log file keeps it whole
    assert summary.best_command.endswith(" ".join(to_argv(summary.best.config)))
    assert f"best (trial 2): {' '.join(to_argv(summary.best.config))}" in lines
    assert "default (trial 0): --load-format dummy" in lines
    assert "outputs: out/heavy/ (state: time-limit)" in lines and "report: out/heavy/report.html" in lines
    table = lines[:lines.index("default (trial 0): --load-format dummy")]
    assert all(len(line) <= 80 for line in table) and "…" not in out.getvalue()
    assert "p99 TTFT <= 1500 ms, p99 ITL <= 35 ms" in table[0]
    best_row = r"│ best \(trial 2\) +│ 9\.26 +│ 13\.19 +│ 244\.1 +│ 30\.6 +│$"  # numbers only, in one line
    assert any(re.match(best_row, line) for line in table), table


def test_the_cli_tune_ends_with_the_answer_whole_in_a_log_file(tiny_model, tmp_path):
    """The command's own path from the tuner's summary to the console, the tuner stood in for."""
    summary = committed_summary()
    opts = TuneArgs(model=str(tiny_model), workload=ROOT / "examples" / "chat.yaml", out=tmp_path / "out",
                    slo=["itl_p99_ms=35"]).resolve()
    with printed(80, terminal=False) as out, mock.patch("servetune.tuner.loop.tune", return_value=summary):
        _tune(opts)
    lines = out.getvalue().splitlines()
    assert f"run it: {summary.best_command}" in lines and f"outputs: {opts.out}/ (state: time-limit)" in lines
    assert " ".join(summary.answer.split()) in " ".join(out.getvalue().split())


def help_page(args: list[str], width: int) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_each_commands_help_fits_the_width_whole_with_what_to_type_and_an_example(args, width):
    page = help_page(args, width)
    assert all(len(line) <= width for line in page.splitlines())
    assert "…" not in page  # no help text cut to fit its column
    assert not re.search(r"<(bool|str|int|float|path|list\[\w+\]|int range|float range)>", page), page
    assert "Example:" in page and re.search(rf"^ +servetune {' '.join(args)} --", page, re.M), page


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_every_option_has_a_help_text_and_says_what_to_type(args):
    command = typer.main.get_command(app)
    for name in args:
        command = command.commands[name]
    for param in command.params:
        assert param.help, param.name
        assert param.is_flag or param.metavar, param.name  # RATE, DURATION, KEY=VALUE, PATH, N, ...


def test_tune_groups_its_options_into_panels():
    page = help_page(["tune"], 100)
    panels = re.findall(r"╭─ (.+?) ─", page)
    assert panels == ["Model, workload and SLOs", "Outputs and study storage", "Search",
                      "Every config, reference configs and the head-to-head", "Load levels", "Time",
                      "Parallel trials and clusters", "Help"]
    assert re.search(r"--time-limit +DURATION ", page) and re.search(r"--engine-arg +KEY=VALUE ", page)
    assert re.search(r"--tokenizer +PATH +Tokenizer to build the prompts", page)


def test_the_command_list_says_each_summary_in_one_sentence():
    listed = " ".join(help_page([], 80).replace("│", " ").split())
    for name, sub in typer.main.get_command(app).commands.items():
        summary = sub.help.split("\n\n")[0]
        assert "\n" not in summary and summary.endswith("."), name
        assert f"{name} {summary}" in listed, name


def test_a_docstring_becomes_help_whose_prose_the_terminal_wraps_and_whose_example_stays():
    doc = """One sentence
    on two lines.

    A paragraph, wrapped
    in the source.

    Example:
      servetune tune --model M \\
        --out OUT
    """
    assert help_text(doc) == ("One sentence on two lines.\n\nA paragraph, wrapped in the source.\n\n"
                              "Example:\n  servetune tune --model M \\\n    --out OUT")
