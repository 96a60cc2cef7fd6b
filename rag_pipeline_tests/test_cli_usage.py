"""A usage error, of any command at any depth, is one line and exit 2; --help stays click's help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli


def _leaves(group: click.Group, path: tuple[str, ...] = ()):
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _leaves(command, (*path, name))
        else:
            yield (*path, name)


COMMANDS = list(_leaves(cli))


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_an_unknown_option_is_one_line_naming_the_command(path):
    result = CliRunner().invoke(cli, [*path, "--no-such-option"], prog_name="rag-pipeline")
    assert result.exit_code == 2
    assert result.output == (f"rag-pipeline: No such option '--no-such-option' "
                             f"(see rag-pipeline {' '.join(path)} --help)\n")


@pytest.mark.parametrize("args, line", [
    (["site", "show"], "rag-pipeline: Missing argument 'NAME' (see rag-pipeline site show --help)"),
    (["nosuch"], "rag-pipeline: No such command 'nosuch' (see rag-pipeline --help)"),
    (["--bogus"], "rag-pipeline: No such option '--bogus' (see rag-pipeline --help)"),
    (["search", "--mode", "x", "q"], "rag-pipeline: Invalid value for '--mode': 'x' is not one of 'vector', "
                                     "'lexical', 'hybrid' (see rag-pipeline search --help)"),
    # A command's own BadParameter, raised in its body.
    (["cadence", "set", "https://docs.example.com/", "often"],
     "rag-pipeline: Invalid value: cannot read interval 'often': use e.g. 30s, 15m, 6h, 1d, 2w or 1h30m "
     "(see rag-pipeline cadence set --help)"),
])
def test_usage_errors_are_one_line_and_exit_2(args, line):
    result = CliRunner().invoke(cli, args, prog_name="rag-pipeline")
    assert (result.exit_code, result.output) == (2, line + "\n")


def test_a_mistyped_option_keeps_its_suggestion_on_the_one_line():
    result = CliRunner().invoke(cli, ["search", "--moed", "x", "q"], prog_name="rag-pipeline")
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1
    assert "Did you mean '--mode'?" in result.output


@pytest.mark.parametrize("args", [["--help"], ["site", "show", "--help"], ["cadence", "set", "--help"]])
def test_help_is_click_help(args):
    result = CliRunner().invoke(cli, args, prog_name="rag-pipeline")
    assert result.exit_code == 0 and result.output.startswith("Usage: rag-pipeline")


def test_the_installed_command_prints_the_one_line_on_stderr():
    done = subprocess.run([str(Path(sys.executable).parent / "rag-pipeline"), "site", "show"],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "rag-pipeline: Missing argument 'NAME' (see rag-pipeline site show --help)\n"
