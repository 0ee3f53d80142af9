"""Verdict -> JUnit XML (junitparser): one test case per check, the figures in the failure message, its time the
seconds the stage it judges ran (status.json `elapsed_s`; left out where the cell recorded none).

GitHub's test reporters show the message, not <properties>, so the message carries the figures too.
"""

from __future__ import annotations

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from kvgate.gate.verdict import Check, Verdict
from kvgate.report import words


def render_junit(verdict: Verdict) -> bytes:
    cases: dict[str, list[TestCase]] = {}
    for check in verdict.checks:
        case = TestCase(check.name if check.subject else check.cell, classname=f"kvgate.{check.kind}")
        if check.subject:
            case.name = f"{check.cell}[{check.subject}]"
        message = _message(check)
        if check.status == "fail":
            case.result = [Failure(message, type_="regression")]
        elif check.status in ("error", "missing"):
            case.result = [Error(message, type_=check.status)]
        elif check.status in ("waived", "not_run", "info"):
            case.result = [Skipped(message)]
        case.system_out = message
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


def _message(check: Check) -> str:
    parts = [f"{words.label(words.word_of(check))}: {check.detail}"]  # RAN, not PASS, where nothing was judged
    if check.threshold_text:
        parts.append(f"threshold {check.threshold_text}")
    if check.method:
        parts.append(check.method)
    parts.extend(check.notes)
    return " | ".join(parts)
