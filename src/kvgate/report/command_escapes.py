"""GitHub Actions workflow commands (`::error title=<property>::<data>`), escaped so that text from a results folder
stays the one command it was written into. It imports nothing: ci/ci_facts.py loads this file by its path for the CI
scripts, which run on a bare python3 without kvgate's dependencies.

GitHub's runner reads a command from any line of a step's output that starts with `::`, and unescapes `%25`, `%0D`,
`%0A` in its data (and `%3A`, `%2C` in a property): actions/toolkit's `escapeData` and `escapeProperty`
(packages/core/src/command.ts) escape those. kvgate also escapes every `::` in data (as `%3A%3A`, which the runner
shows as it is), so no data can read as a command however it is later cut or passed on.
"""

from __future__ import annotations


def escape_data(text: str) -> str:
    return (str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
            .replace("::", "%3A%3A"))


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(name: str, message: str, **properties: str) -> str:
    """`::name key=value,...::message`, every property and the message escaped."""
    shown = ",".join(f"{key}={escape_property(value)}" for key, value in properties.items())
    return f"::{name}{' ' + shown if shown else ''}::{escape_data(message)}"
