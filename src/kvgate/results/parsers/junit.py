"""JUnit XML as pytest --junitxml writes it (one <testsuite>, or <testsuites> around several), via junitparser."""

from __future__ import annotations

import re
from typing import Any

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite
from junitparser.junitparser import JUnitXmlError

from kvgate import InputError
from kvgate.results.records import KernelCase, KernelResult


def parse_junit(text: str | bytes, source: str) -> KernelResult:
    data = text.encode("utf-8") if isinstance(text, str) else text
    if not data.strip():
        raise InputError(source, "empty file", "the file", "Expected pytest --junitxml output")
    try:
        xml = JUnitXml.fromstring(data)
    except (SyntaxError, JUnitXmlError) as error:  # lxml's and ElementTree's parse errors are SyntaxErrors
        raise InputError(source, f"not valid JUnit XML ({_first_line(str(error))})", "the file",
                         "Expected pytest --junitxml output") from None
    if not isinstance(xml, (JUnitXml, TestSuite)):
        raise InputError(source, f"root element is <{xml.tag}>, not <testsuites> or <testsuite>", "the file",
                         "Expected pytest --junitxml output")
    # every <testsuite> and <testcase> at any depth (xml._elem: the lxml element junitparser wraps): junitparser's
    # iteration reads no <testsuites> inside <testsuites> and no <testcase> outside a suite, whose failures went unread
    elements = [elem for elem in xml._elem.iter() if elem.tag in ("testsuite", "testcase")]
    for elem in xml._elem.iter():
        if elem.tag in ("testsuites", "testsuite"):
            _check_counts(elem, source)
    cases: list[KernelCase] = []
    properties: dict[str, str] = {}
    for suite in (TestSuite.fromelem(elem) for elem in elements if elem.tag == "testsuite"):
        for prop in suite.properties():
            properties[str(prop.name)] = str(prop.value)
    for case in (TestCase.fromelem(elem) for elem in elements if elem.tag == "testcase"):
        name = f"{case.classname}::{case.name}" if case.classname else str(case.name)
        outcome, message = "passed", ""
        for result in case.result:
            if isinstance(result, Error):
                outcome, message = "error", _first_line(result.message or result.text or "")
                break
            if isinstance(result, Failure):
                outcome, message = "failed", _first_line(result.message or result.text or "")
                break
            if isinstance(result, Skipped):
                outcome, message = "skipped", _first_line(result.message or "")
        cases.append(KernelCase(name=name, outcome=outcome, message=message, seconds=_seconds(case)))
    return KernelResult(source=source, cases=tuple(cases), properties=properties)


_COUNT = re.compile(r"[0-9]{1,18}")


def _check_counts(suite: Any, source: str) -> None:
    """A suite's `failures` and `errors` are at most the <failure> and <error> results of its test cases (pytest writes
    exactly one per count): a file that counts failures its cases do not hold was cut or edited, and read by its cases
    alone it passed."""
    for attribute, tag in (("failures", "failure"), ("errors", "error")):
        value = suite.get(attribute)
        if value is None:
            continue
        name = suite.get("name")
        where = f"<{suite.tag}{f' name={name[:60]!r}' if name is not None else ''}>"
        if not _COUNT.fullmatch(value.strip()):
            raise InputError(source, f"{attribute}={value[:20]!r} is not a count (a whole number >= 0)", where,
                             "Expected pytest --junitxml output")
        held = sum(1 for case in suite.iter("testcase") for result in case if result.tag == tag)
        if int(value) > held:
            raise InputError(source, f"{attribute}={value.strip()!r}, but its test cases hold {held} <{tag}>", where,
                             "Is the file cut short or edited? pytest writes one per failed or errored test")


MESSAGE_CHARACTERS = 500  # of pytest's message kept: a kernel test's first line holds its mismatch figures


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0][:MESSAGE_CHARACTERS] if text else ""


def _seconds(case: object) -> float | None:
    try:
        value = float(getattr(case, "time", None) or 0.0)
    except (TypeError, ValueError):  # a hand-written time="fast"
        return None
    return value if value >= 0 and value == value and value != float("inf") else None
