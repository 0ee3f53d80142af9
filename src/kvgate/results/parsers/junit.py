"""JUnit XML as pytest --junitxml writes it (one <testsuite>, or <testsuites> around several), via junitparser."""

from __future__ import annotations

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
