"""The `kafkalog` command's usage surface: --version, the list of commands (`kafkalog` alone, --help), and
unknown options reported by the subcommand they were given to, with its usage and a did-you-mean."""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import re

import pytest

from kafkalog_ds.cli import build_parser, main


def run(capsys, *argv):
    rc = main(list(argv), stdin=io.BytesIO(b""))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_version_prints_the_installed_version(capsys):
    rc, out, err = run(capsys, "--version")
    assert rc == 0 and err == ""
    assert out == f"kafkalog {importlib.metadata.version('kafkalog-ds')}\n"


@pytest.mark.parametrize(
    ("argv", "usage", "hint"),
    [
        (["consume", "./logs", "--topic", "events", "--offest", "earliest"], "kafkalog consume", "--offset"),
        (["produce", "./logs", "--topic", "t", "--compresion", "lz4"], "kafkalog produce", "--compression"),
        (["dump-log", "x.log", "--print-datalog"], "kafkalog dump-log", "--print-data-log"),
        (["topics", "./logs", "--list", "--if-exsts"], "kafkalog topics", "--if-exists"),
        (["maintain", "./logs", "--once", "--intervl-ms=5"], "kafkalog maintain", "--interval-ms"),
    ],
)
def test_misspelled_option_gets_the_subcommands_usage_and_a_suggestion(capsys, argv, usage, hint):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith(f"usage: {usage} ")
    assert f"{usage}: error: unrecognized arguments: " in err
    assert f"did you mean {hint}?" in err


def test_unknown_option_with_nothing_close_names_it_without_a_guess(capsys):
    rc, _, err = run(capsys, "consume", "./logs", "--topic", "events", "--zzzzzz")
    assert rc == 2 and err.startswith("usage: kafkalog consume ")
    assert "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err


def _commands(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The parser's subcommands and their help strings, as argparse holds them."""
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {a.dest: a.help for a in sub._choices_actions}


def test_kafkalog_alone_lists_every_command_one_a_line_as_help_does(capsys):
    commands = _commands(build_parser())
    assert {"topics", "produce", "consume", "dump-log", "describe", "maintain", "export-to-broker"} <= set(commands)
    assert all(commands.values()), commands  # every command says what it does
    rc, out, err = run(capsys)
    assert rc == 2 and out == ""
    assert err.startswith("usage: kafkalog [-h] [--version] COMMAND ...\n")
    section = err.split("\ncommands:\n", 1)[1].split("\n\n", 1)[0]
    listed = [re.fullmatch(r"  (\S+) +(\S.*)", line) for line in section.splitlines()]
    assert all(listed), section
    assert [m.groups() for m in listed] == list(commands.items())  # one line each, in the parser's order
    assert "`kafkalog COMMAND --help` shows a command's options." in err
    rc, help_out, help_err = run(capsys, "--help")
    assert (rc, help_err) == (0, "") and help_out == err  # --help prints the same, on stdout
