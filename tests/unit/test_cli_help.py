"""Every `accord` subcommand (nested operations included) has a description and every
option a help text: `accord COMMAND --help` tells a person what it does."""

from __future__ import annotations

import argparse

from accord.cli import build_parser


def _parsers(
    parser: argparse.ArgumentParser, path: str = "accord"
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _parsers(child, f"{path} {name}")
    return found


def test_every_command_and_option_says_what_it_is() -> None:
    missing = []
    for path, parser in _parsers(build_parser())[1:]:
        if not parser.description:
            missing.append(f"{path}: no description")
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}: no help")
    assert missing == []


def test_the_scan_sees_nested_operations() -> None:
    paths = {path for path, _ in _parsers(build_parser())}
    assert {"accord repair resolve-effect", "accord relay held", "accord jobs show"} <= paths
