"""Verdict -> JUnit XML (junitparser), in the verdict's own totals (kvgate.gate.verdict.Totals): one test case per
check, its outcome its word's (JUNIT_OUTCOME: FAIL a failure, ERROR and MISSING an error, PASS a pass, every word
that judged nothing skipped, with the word in its message), except that a kernels check whose pytest run left test
outcomes is written as those tests, one case each, with pytest's own message (mismatch counts, max error,
tolerance), so a check run lists the failing kernel tests by name. A case's time is the seconds the stage it judges
ran (status.json `elapsed_s`), a kernel test's its own (left out where none was recorded).

GitHub's test reporters show the message, not <properties>, so the message carries the figures, the first real
error of a broken stage's log with its place, and the command that reruns the cell.
"""

from __future__ import annotations

import re

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from kvgate.gate import rerun
from kvgate.gate.verdict import JUNIT_OUTCOME, Check, Verdict
from kvgate.report import words


def render_junit(verdict: Verdict) -> bytes:
    cases: dict[str, list[TestCase]] = {}
    for check in verdict.checks:
        follow = follow_up(check, verdict)
        outcomes = check.test_outcomes()
        if outcomes:
            for test, outcome in outcomes:
                case = TestCase(xml_text(test.name), classname=xml_text(f"kvgate.kernels.{check.cell}"))
                label = words.label(words.word_of(check)) if outcome == "skipped" and check.word == words.WAIVED \
                    else test.outcome
                message = " | ".join(part for part in (f"{label}: {test.message or test.outcome}",
                                                       *(follow if outcome in ("failure", "error") else ())) if part)
                _set(case, outcome, message, type_="kernel test")
                if test.seconds is not None:
                    case.time = test.seconds
                cases.setdefault(check.kind, []).append(case)
            continue
        case = TestCase(xml_text(check.name if check.subject else check.cell), classname=f"kvgate.{check.kind}")
        if check.subject:
            case.name = xml_text(f"{check.cell}[{check.subject}]")
        message = " | ".join([_message(check), *follow])
        _set(case, JUNIT_OUTCOME[check.word], message, type_="regression" if check.word == words.FAIL else check.status)
        if check.seconds is not None:
            case.time = check.seconds
        cases.setdefault(check.kind, []).append(case)
    xml = JUnitXml("kvgate gate")
    for kind, members in cases.items():
        suite = TestSuite(f"kvgate.{kind}")
        suite.add_testcases(members)  # one statistics pass (add_testcase recounts the suite every time)
        xml.add_testsuite(suite)
    xml.update_statistics()
    return xml.tostring()


# what XML 1.0 cannot hold (lxml refuses it): control characters but tab, newline and carriage return, lone surrogates
# (a folder name that is not UTF-8 reads with them), U+FFFE and U+FFFF
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """Text of a results folder (a cell folder's name, a stage's reason) as XML holds it: what it cannot hold written
    as a visible escape (`\\x07`, `\\udcff`)."""
    return NOT_XML.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


def _set(case: TestCase, outcome: str, message: str, *, type_: str) -> None:
    message, type_ = xml_text(message), xml_text(type_)
    if outcome == "failure":
        case.result = [Failure(message, type_=type_)]
    elif outcome == "error":
        case.result = [Error(message, type_=type_)]
    elif outcome == "skipped":
        case.result = [Skipped(message)]
    case.system_out = message


def follow_up(check: Check, verdict: Verdict) -> list[str]:
    """For a failing check: its log's first real error and where it is, and the command that reruns its cell."""
    if not check.failing:
        return []
    parts = []
    if check.log is not None:
        where = check.log.where + (f" ({check.log.url})" if check.log.url and check.log.url != check.log.where else "")
        parts.append(f"first error: {check.log.error} at {where}")
    command = rerun.rerun_command(check, verdict.run_info)
    if command:
        parts.append(f"rerun: {command}")
    return parts


def _message(check: Check) -> str:
    parts = [f"{words.label(words.word_of(check))}: {check.detail}"]  # RAN, not PASS, where nothing was judged
    if check.threshold_text:
        parts.append(f"threshold {check.threshold_text}")
    if check.method:
        parts.append(check.method)
    parts.extend(check.notes)
    return " | ".join(parts)
