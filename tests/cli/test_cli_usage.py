"""The `kafkalog` command's usage surface: --version, and unknown options reported by the subcommand
they were given to, with its usage and a did-you-mean."""

from __future__ import annotations

import importlib.metadata
import io

import pytest

from kafkalog_ds.cli import main


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
