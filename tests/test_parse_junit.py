"""JUnit parser on real pytest 9.2.0 --junitxml outputs (tests/fixtures/junit) read through junitparser 5.0.3."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate import InputError
from kvgate.results.parsers import junit
from kvgate.results.parsers.reading import read_text

FIXTURES = Path(__file__).parent / "fixtures" / "junit"


@pytest.mark.parametrize("name", ["pytest-mixed.xml", "pytest-mixed-xunit2.xml"])
def test_pass_failure_error_and_skip_of_pytest(name):
    result = junit.parse_junit(read_text(FIXTURES / name), "junit.xml")
    outcomes = {case.name: (case.outcome, case.message) for case in result.cases}
    print(outcomes)
    assert outcomes == {
        "test_kernels_demo::test_decode_matches_reference[auto]": ("passed", ""),
        "test_kernels_demo::test_decode_matches_reference[fp8]": ("passed", ""),
        "test_kernels_demo::test_fp8_decode_tolerance": ("failed", "AssertionError: max abs error 0.31 > 0.05"),
        "test_kernels_demo::test_uses_fixture": (
            "error", 'failed on setup with "RuntimeError: CUDA error: no kernel image is available"'),
        "test_kernels_demo::test_sm100_only": ("skipped", "needs sm100"),
    }
    assert [c.name for c in result.problems] == ["test_kernels_demo::test_fp8_decode_tolerance",
                                                 "test_kernels_demo::test_uses_fixture"]


def test_all_passing():
    result = junit.parse_junit(read_text(FIXTURES / "pytest-pass.xml"), "junit.xml")
    assert (result.count("passed"), len(result.problems)) == (2, 0)


def test_a_bare_testsuite_root_is_read_too():
    result = junit.parse_junit('<testsuite name="s"><testcase classname="c" name="t"/></testsuite>', "j")
    assert [(c.name, c.outcome) for c in result.cases] == [("c::t", "passed")]


@pytest.mark.parametrize("text", [
    '<testsuites><testsuites><testsuite name="i"><testcase classname="c" name="bad"><failure message="boom"/>'
    '</testcase></testsuite></testsuites><testsuite name="o"><testcase classname="c" name="ok"/></testsuite></testsuites>',
    '<testsuites><testcase classname="c" name="bad"><failure message="boom"/></testcase>'
    '<testsuite name="o"><testcase classname="c" name="ok"/></testsuite></testsuites>',
])
def test_a_failing_test_outside_the_top_suites_is_read(text):
    """junitparser reads neither a <testsuites> inside <testsuites> nor a <testcase> outside a suite: the failing test
    there went unread and the kernels stage passed on the other one."""
    result = junit.parse_junit(text, "j")
    assert sorted((c.name, c.outcome, c.message) for c in result.cases) == [("c::bad", "failed", "boom"),
                                                                            ("c::ok", "passed", "")]


@pytest.mark.parametrize(("text", "message"), [
    ("", "j.xml: empty file in the file. Expected pytest --junitxml output"),
    ("<testsuites><testsuite", "j.xml: not valid JUnit XML (Couldn't find end of Start Tag testsuite line 1, line 1, "
                               "column 23 (<string>, line 1)) in the file. Expected pytest --junitxml output"),
    ("<html></html>", "j.xml: not valid JUnit XML (Invalid format.) in the file. Expected pytest --junitxml output"),
    # a suite that counts failures its cases do not hold (cut, or edited): read by its cases alone it passed
    ('<testsuites><testsuite name="pytest" tests="3" failures="2" errors="0"><testcase classname="c" name="t"/>'
     '</testsuite></testsuites>',
     "j.xml: failures='2', but its test cases hold 0 <failure> in <testsuite name='pytest'>. Is the file cut short or "
     "edited? pytest writes one per failed or errored test"),
    ('<testsuites errors="1"><testsuite name="pytest" errors="0"><testcase classname="c" name="t"/></testsuite>'
     '</testsuites>',
     "j.xml: errors='1', but its test cases hold 0 <error> in <testsuites>. Is the file cut short or edited? pytest "
     "writes one per failed or errored test"),
    ('<testsuite name="s" failures="many"><testcase classname="c" name="t"/></testsuite>',
     "j.xml: failures='many' is not a count (a whole number >= 0) in <testsuite name='s'>. Expected pytest --junitxml "
     "output"),
    ('<testsuite name="s" errors="' + "9" * 5000 + '"><testcase classname="c" name="t"/></testsuite>',
     "j.xml: errors='99999999999999999999' is not a count (a whole number >= 0) in <testsuite name='s'>. Expected "
     "pytest --junitxml output"),
])
def test_unreadable_junit(text, message):
    with pytest.raises(InputError) as error:
        junit.parse_junit(text, "j.xml")
    assert str(error.value) == message
