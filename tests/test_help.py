"""Every `--help` option says what it does, and `simulate --fault` lists its kinds (issue 33 item 7)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from bridge.cli import main
from bridge.simulator import FAULT_KINDS


def _commands(command: click.Command, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, command)]
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None
            found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands(main, ())


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=lambda c: " ".join(c) if isinstance(c, tuple) else "")
def test_every_option_of_every_command_has_a_sentence_of_help(path: tuple[str, ...], command: click.Command) -> None:
    silent = [option.opts[-1] for option in command.params
              if isinstance(option, click.Option) and not option.hidden and len((option.help or "").split()) < 2]
    assert not silent, f"dcgm-bridge {' '.join(path)}: no help for {silent}"
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output


def test_the_fault_option_lists_every_kind() -> None:
    text = " ".join(CliRunner().invoke(main, ["simulate", "--help"]).output.split())
    assert all(kind in text for kind in FAULT_KINDS)
