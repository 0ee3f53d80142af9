"""The history of main: the gate records a run of main (SQLite; PostgreSQL on a real server), Otava's e-divisive finds
a shift no single run crossed, and `kvgate history` shows and flags it."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

from cpu_run_fixture import extract, matrix_of_the_run
from kvgate import InputError
from kvgate.cli import gate_command, main
from kvgate.history import detect, record, store, trends
from test_fp8_kv_cache_check import gate_cli, h200_matrix, h200_unpacked  # noqa: F401 (fixtures)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from history_change_points import STEP_AT, found_at, synthetic_history

needs_otava = pytest.mark.skipif(not detect.available(), reason="Apache Otava is not installed (pip install --no-deps "
                                 "-r ci/requirements-history.txt; nox -s tests does)")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """The real CPU run (tests/fixtures/cpu_run) and the matrix it is judged by."""
    folder = tmp_path_factory.mktemp("cpu")
    return extract(folder), matrix_of_the_run(folder / "matrix")


def run_naming(cpu_run, tmp_path: Path, branch: str | None) -> Path:
    run, _ = cpu_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    info = json.loads((copy / "run.json").read_text(encoding="utf-8"))
    if branch is not None:
        info["branch"] = branch
    (copy / "run.json").write_text(json.dumps(info), encoding="utf-8")
    return copy


def gate(cpu_run, run: Path, db: Path) -> int:
    _, matrix = cpu_run
    return main(["gate", str(run), "--matrix-dir", str(matrix), "--today", "2026-12-01", "--history", str(db)])


def test_a_gate_run_of_main_writes_its_figures_into_the_sqlite_history(cpu_run, tmp_path, capsys):
    db = tmp_path / "history.sqlite3"
    assert gate(cpu_run, run_naming(cpu_run, tmp_path, "main"), db) == 0
    assert "recorded 15 figures of this main run" in capsys.readouterr().err
    with sqlite3.connect(db) as connection:
        runs = connection.execute("SELECT branch, git_commit, vllm_version, passed, neutral, environment "
                                  "FROM history_runs").fetchall()
        figures = dict(((cell, measure), (value, low, high, n)) for cell, measure, value, low, high, n in
                       connection.execute("SELECT cell, measure, value, low, high, n FROM history_figures"))
        migrations = connection.execute("SELECT version FROM history_migrations").fetchall()
    print(runs, figures)
    assert migrations == [(store.SCHEMA_VERSION,)]
    branch, commit, vllm_version, passed, neutral, environment = runs[0]
    assert (branch, commit, vllm_version, passed, neutral) == (
        "main", "a34784f5d4215050d9686da11120cd939d660e04", "0.32.0+cpu", 1, 1)  # run.json versions.vllm
    assert json.loads(environment)["cpu"] == "Intel(R) Xeon(R) Processor @ 2.00GHz"
    value, low, high, n = figures[("cpu_attn-auto-cpu", "accuracy:strict-match")]
    assert (value, n) == (0.85, 240)  # 204 of 240, the run's lm-eval results file
    assert low == pytest.approx(0.85 - 1.959964 * 0.023097, abs=1e-5) and high == pytest.approx(0.85 + 1.959964 * 0.023097, abs=1e-5)
    assert figures[("cpu_attn-fp8-cpu", "throughput:requests_per_second")] == (pytest.approx(6.947751), None, None, 3)
    assert figures[("cpu_mla-auto-cpu", "accuracy:flexible-extract")][1] == 0.0  # 2 of 240: the interval stops at 0
    assert {m for _, m in figures} == {"accuracy:strict-match", "accuracy:flexible-extract", *record.THROUGHPUT_MEASURES.values()}


def test_the_history_orders_runs_by_their_own_time_and_draws_a_date_and_commit_axis_with_links(cpu_run, tmp_path):
    """Each run is recorded at the time run.json says it finished (not when the gate judged it): a run judged late
    takes its own place. The trend's x axis names each run's date and commit, the commit a link to its page on GitHub
    where run.json names the repository (GitHub Actions' "owner/name")."""
    db = tmp_path / "history.sqlite3"
    older, newer = tmp_path / "older", tmp_path / "newer"
    for folder, finished, commit in ((newer, "2026-12-01T03:48:30Z", "b" * 40), (older, "2026-11-20T10:00:00Z", "a" * 40)):
        run = run_naming(cpu_run, folder, "main")
        info = json.loads((run / "run.json").read_text(encoding="utf-8"))
        info.update(finished_at=finished, commit=commit, repository="acme/kvgate")
        (run / "run.json").write_text(json.dumps(info), encoding="utf-8")
        assert gate(cpu_run, run, db) == 0  # the newer run is judged first
    with store.open_store(str(db)) as history:
        points = history.series("main", "cpu_attn-auto-cpu", "accuracy:strict-match")
    assert [(p.recorded_at, p.commit[:1], p.commit_url) for p in points] == [
        ("2026-11-20T10:00:00Z", "a", f"https://github.com/acme/kvgate/commit/{'a' * 40}"),
        ("2026-12-01T03:48:30Z", "b", f"https://github.com/acme/kvgate/commit/{'b' * 40}")]
    section = history_section(older / "run" / "gate" / "report.html")
    assert '>2026-11-20</text>' in section and '>2026-12-01</text>' in section
    assert (f'<a href="https://github.com/acme/kvgate/commit/{"a" * 40}" target="_top"><text' in section
            and f'>{"a" * 9}</text></a>' in section)


@pytest.mark.parametrize(("repository", "url"), [
    ("vllm-project/vllm", "https://github.com/vllm-project/vllm/commit/{}"),
    ("https://github.com/vllm-project/vllm.git", "https://github.com/vllm-project/vllm/commit/{}"),
    ("git@github.com:vllm-project/vllm.git", "https://github.com/vllm-project/vllm/commit/{}"),
    ("https://gitlab.com/acme/vllm", None), ("javascript:alert(1)//x/y", None), (None, None)])
def test_a_commit_links_to_its_page_only_on_github(repository, url):
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert record.commit_url(repository, sha) == (url.format(sha) if url else None)
    assert record.commit_url(repository, "not a sha") is None


def test_a_run_that_names_no_branch_or_another_leaves_no_history(cpu_run, tmp_path):
    for branch in (None, "feature"):
        db = tmp_path / f"{branch}.sqlite3"
        run = run_naming(cpu_run, tmp_path / str(branch), branch)
        assert gate(cpu_run, run, db) == 0
        assert not db.exists()
        assert '<section id="history">' not in (run / "gate" / "report.html").read_text(encoding="utf-8")


def history_section(report_html: Path) -> str:
    return report_html.read_text(encoding="utf-8").split('<section id="history">')[1].split("</section>")[0]


def test_report_html_of_a_run_of_main_shows_the_trend_of_each_of_its_cells(cpu_run, tmp_path):
    db = tmp_path / "history.sqlite3"
    run = run_naming(cpu_run, tmp_path, "main")
    for finished_at in (None, "2026-12-02T00:00:00Z"):  # a second run of the same commit (the same run again replaces)
        if finished_at is not None:
            info = json.loads((run / "run.json").read_text(encoding="utf-8"))
            (run / "run.json").write_text(json.dumps({**info, "finished_at": finished_at}), encoding="utf-8")
        assert gate(cpu_run, run, db) == 0
    section = history_section(run / "gate" / "report.html")
    print(section)
    assert ("This run is recorded in the history of main; here the trend of each of its 3 cells, over the newest 30 "
            "runs at most") in section
    drawn = re.findall(r'aria-label="([^"]+)">\s*<title>[^<]*: (\d+) runs on main</title>', section)
    assert drawn == [(f"{cell} {measure}", "2") for cell in ("cpu_attn-auto-cpu", "cpu_attn-fp8-cpu", "cpu_mla-auto-cpu")
                     for measure in ("accuracy:strict-match", "throughput:requests_per_second")]
    assert section.count('<div class="scroll"><svg') == 3  # one box per cell, scrolling sideways on a phone


def test_a_history_that_cannot_be_written_is_one_error_line(cpu_run, tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    run = run_naming(cpu_run, tmp_path, "main")
    assert gate(cpu_run, run, tmp_path / "folder") == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"ERROR {tmp_path / 'folder'}: is a folder. Name the history's SQLite file, e.g. reports/history.sqlite3")
    assert (run / "gate" / "verdict.json").is_file()  # the run is judged and reported all the same


def test_the_history_keeps_each_cells_kernel_timings_and_draws_the_cells_that_need_attention_first(
        h200_unpacked, h200_matrix, tmp_path, monkeypatch, capsys):  # noqa: F811 (fixtures)
    """The real H200 run: 13 cells wrote kernels/timings.json (31 timed cases); each case is one figure, its median
    over its repeats, and a file the reader refuses is left out with its reason. report.html draws at most
    HISTORY_PLOTTED_CELLS cells, the failing ones first."""
    run = Path(shutil.copytree(h200_unpacked, tmp_path / "run"))
    info = json.loads((run / "run.json").read_text(encoding="utf-8"))
    (run / "run.json").write_text(json.dumps({**info, "branch": "main"}), encoding="utf-8")
    corrupt = run / "flex_attention-auto-sm90" / "kernels" / "timings.json"
    written = {path.parent.parent.name: json.loads(path.read_text(encoding="utf-8"))["entries"]
               for path in run.glob("*/kernels/timings.json") if path != corrupt}
    corrupt.write_text(json.dumps({**json.loads(corrupt.read_text(encoding="utf-8")), "version": 2}), encoding="utf-8")
    monkeypatch.setattr(gate_command, "HISTORY_PLOTTED_CELLS", 2)
    db = tmp_path / "history.sqlite3"
    assert gate_cli(run, h200_matrix, tmp_path / "out", "--history", str(db)) == 1
    assert (f"kvgate gate: kernel timings of flex_attention-auto-sm90 not recorded in the history: {corrupt}: format "
            "version 2 is newer than this kvgate reads (1)") in capsys.readouterr().err
    with sqlite3.connect(db) as connection:
        kernels = {(cell, measure): (value, n) for cell, measure, value, n in connection.execute(
            "SELECT cell, measure, value, n FROM history_figures WHERE measure LIKE 'kernels:%'")}
    assert len(written) == 12 and sum(map(len, written.values())) == len(kernels) == 29
    for cell, entries in written.items():
        for entry in entries:
            measure = f"kernels:{entry['family']}/{entry['kv_cache_dtype']}/{entry['spec']}:median_us"
            assert kernels[cell, measure] == (entry["median_us"], entry["repeats"])
    assert kernels["triton_mla-fp8-sm90", "kernels:vllm_triton_mla/fp8_e4m3/b128-h16-kv4096:median_us"] == (358.29, 30)
    section = history_section(tmp_path / "out" / "report.html")
    assert "here the trends of 2 of its 12 cells, those that need attention first" in section
    assert re.findall(r'<svg y="0"[^>]*aria-label="([^" ]+) ', section) == ["flash_attn-auto-sm90",
                                                                          "flashinfer-fp8-sm90"]


def test_a_store_of_a_newer_schema_is_refused(tmp_path):
    db = tmp_path / "h.sqlite3"
    store.open_store(str(db)).__exit__()
    with sqlite3.connect(db) as connection:
        connection.execute("INSERT INTO history_migrations VALUES (99, 'later')")
    with pytest.raises(Exception) as error:
        store.open_store(str(db))
    assert str(error.value) == f"{db}: history schema version 99 is newer than this kvgate knows (1). Upgrade kvgate"


def commit_of(index: int) -> str:
    return f"{index:04d}".ljust(40, "a")


def seeded_history(db: Path | str, values: list[float], cell: str = "flashmla-fp8-sm90",
                   measure: str = "throughput:requests_per_second") -> None:
    with store.open_store(str(db)) as history:
        for index, value in enumerate(values):
            history.record(record.HistoryRun(
                recorded_at=f"2026-10-{1 + index // 24:02d}T{index % 24:02d}:00:00Z", branch="main",
                commit=commit_of(index), vllm_version="0.26.0", vllm_commit=None, passed=True, neutral=False,
                exit_status=0, run_folder=f"runs/{index}", environment={},
                figures=(record.Figure(cell=cell, measure=measure, value=value),)))


@needs_otava
def test_a_4_percent_step_at_run_30_of_60_is_found_there_and_60_runs_of_noise_give_none():
    rng = np.random.default_rng(7)
    step = synthetic_history(rng, noise=0.01)
    noise = synthetic_history(rng, noise=0.01, step=0.0)
    found, quiet = detect.change_points(step), detect.change_points(noise)
    print("step:", found, "noise:", quiet)
    assert found_at(found, STEP_AT) and len(found) == 1 and found[0].p_value < detect.MAX_P_VALUE
    assert found[0].change_percent == pytest.approx(-4, abs=1)
    assert quiet == []


@needs_otava
def test_history_detect_flags_the_first_commit_of_the_shift_and_fails_until_acknowledged(tmp_path, capsys):
    db = tmp_path / "h.sqlite3"
    seeded_history(db, synthetic_history(np.random.default_rng(7), noise=0.01))
    svg = tmp_path / "trends.svg"
    assert main(["history", "--db", str(db), "--detect", "--svg", str(svg)]) == 1
    out = capsys.readouterr().out
    print(out)
    flagged = [line for line in out.splitlines() if "CHANGE POINT" in line]
    assert len(flagged) == 1
    index = int(flagged[0].split("change point at run ")[1].split()[0]) - 1
    assert abs(index - STEP_AT) <= 1 and f"commit {commit_of(index)[:12]}," in flagged[0]
    assert "1 change point(s) not acknowledged over 1 series of 60 runs on main" in out
    assert svg.read_text(encoding="utf-8").count('stroke-dasharray="4 3"') == 1
    assert main(["history", "--db", str(db), "--acknowledge", "flashmla-fp8-sm90", "throughput:requests_per_second",
                 commit_of(index)]) == 0
    assert main(["history", "--db", str(db), "--detect"]) == 0
    assert "acknowledged: flashmla-fp8-sm90" in capsys.readouterr().out


def test_history_without_detect_prints_the_trend_and_needs_no_otava(tmp_path, capsys):
    db = tmp_path / "h.sqlite3"
    seeded_history(db, [10.0, 11.0, 12.0])
    assert main(["history", "--db", str(db), "--last", "2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "flashmla-fp8-sm90 throughput:requests_per_second (3 runs on main)"
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["2", "3"]


def test_history_names_an_unknown_cell_with_what_is_recorded(tmp_path, capsys):
    db = tmp_path / "h.sqlite3"
    seeded_history(db, [10.0])
    assert main(["history", "--db", str(db), "--cell", "flashmla-fp8-sm100"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ERROR --cell: no series for 'flashmla-fp8-sm100' in {db}. Recorded: flashmla-fp8-sm90")


def test_an_empty_history_says_how_runs_get_there(tmp_path, capsys):
    store.open_store(str(tmp_path / "h.sqlite3")).__exit__()  # a store with no run yet (a missing file: below)
    assert main(["history", "--db", str(tmp_path / "h.sqlite3")]) == 2
    assert "no runs of main recorded. The gate records a run whose run.json names" in capsys.readouterr().err


def test_the_trend_svg_is_well_formed_and_marks_the_change_point():
    import xml.etree.ElementTree as ElementTree

    points = [store.Point(recorded_at="t", commit=None, vllm_commit=None, value=v, low=v - 1, high=v + 1)
              for v in (10.0, 10.0, 9.0, 9.0)]
    found = [detect.ChangePoint(index=2, p_value=1e-6, mean_before=10.0, mean_after=9.0)]
    root = ElementTree.fromstring(trends.stacked([trends.svg("a&b", "m", points, found)] * 2))
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "a&b m" in texts and "-10.0 % (p = 1e-06)" in texts


def test_a_postgresql_url_without_psycopg_or_a_server_is_one_clear_error(tmp_path, monkeypatch):
    url = "postgresql://kvgate:secret@127.0.0.1:9/history"
    with pytest.raises(Exception) as error:
        store.open_store(url)
    assert "secret" not in str(error.value)
    assert str(error.value).startswith(("KVGATE_HISTORY_URL: names a PostgreSQL server (the PostgreSQL history "
                                        "kvgate@127.0.0.1:9/history)",
                                        "the PostgreSQL history kvgate@127.0.0.1:9/history: cannot connect"))


SECRET_URLS = [
    "postgresql://kvgate:u-secret@127.0.0.1:9/history",
    "postgresql://kvgate@127.0.0.1:9/history?password=q-secret&sslmode=disable",
    "postgres://kvgate:u%2Dsecret@127.0.0.1:9/history?sslpassword=q-secret&Password=r-secret",
    "postgresql://127.0.0.1:9/history?passfile=/secret/pgpass&password=q-secret",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_attack_the_history_url_is_never_printed_nor_its_passwords(url, monkeypatch, capsys):
    """Its password in the userinfo or in the query (`?password=`, `?sslpassword=`): neither the error nor any line
    kvgate prints holds a password or the URL; the server is named in words."""
    monkeypatch.setenv(store.URL_ENV, url)
    assert main(["history"]) == 2
    err = capsys.readouterr().err
    print(err)
    assert err.startswith("ERROR ") and err.count("\n") == 1
    assert "secret" not in err and "postgres://" not in err and "postgresql://" not in err
    assert "the PostgreSQL history " in err and "127.0.0.1:9/history" in err
    assert store.redacted(url).startswith("the PostgreSQL history ")
    assert "secret" not in store.redacted(url)


def test_a_libpq_key_value_string_with_a_password_is_refused_unprinted(monkeypatch, capsys):
    monkeypatch.setenv(store.URL_ENV, "host=127.0.0.1 port=9 dbname=history password=k-secret")
    assert main(["history"]) == 2
    err = capsys.readouterr().err
    assert err == ("ERROR KVGATE_HISTORY_URL: holds a password but is no postgresql:// URL (not shown here). Write "
                   "postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or a SQLite file path\n")


def test_an_error_message_that_quotes_a_password_is_redacted():
    url = "postgresql://kvgate:u%2Dsecret@h/db?password=q-secret"
    assert store._without_secrets('invalid value "q-secret" for "password"; u-secret; u%2Dsecret', url) == (
        'invalid value "***" for "password"; ***; ***')


def postgres_system_user_problem(environ, euid: int, user_exists, executable) -> tuple[str | None, str | None]:
    """(a folder to add to PATH, why the server cannot start here): PostgreSQL refuses to run as root, so pgserver, run
    as root, runs it as a system user `pgserver` it creates with `useradd` from PATH; on Debian useradd (package passwd)
    lies in /usr/sbin, which a user's PATH may leave out."""
    if euid != 0 or user_exists("pgserver"):
        return None, None
    path = environ.get("PATH", "")
    if any(executable(Path(folder) / "useradd") for folder in path.split(os.pathsep) if folder):
        return None, None
    for folder in SYSTEM_BINARIES:
        if executable(Path(folder) / "useradd"):
            return folder, None
    return None, (f"pgserver, run as root, runs PostgreSQL as a system user it creates with useradd, which is neither on "
                  f"PATH nor in {' or '.join(SYSTEM_BINARIES)} (Debian: apt-get install passwd; or run the tests as a "
                  f"user other than root)")


SYSTEM_BINARIES = ("/usr/sbin", "/sbin")


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def test_the_postgresql_server_finds_useradd_off_path_or_says_what_it_needs(tmp_path):
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    (sbin / "useradd").write_text("#!/bin/sh\n")
    (sbin / "useradd").chmod(0o755)
    found = _executable
    assert postgres_system_user_problem({"PATH": "/usr/bin"}, 1000, lambda name: False, found) == (None, None)
    assert postgres_system_user_problem({"PATH": "/usr/bin"}, 0, lambda name: True, found) == (None, None)
    assert postgres_system_user_problem({"PATH": f"/usr/bin:{sbin}"}, 0, lambda name: False, found) == (None, None)
    at = {Path(folder) / "useradd" for folder in SYSTEM_BINARIES}
    assert postgres_system_user_problem({"PATH": "/usr/bin"}, 0, lambda name: False, lambda p: p in at) == (
        "/usr/sbin", None)
    folder, problem = postgres_system_user_problem({"PATH": "/usr/bin"}, 0, lambda name: False, lambda p: False)
    assert folder is None and problem == (
        "pgserver, run as root, runs PostgreSQL as a system user it creates with useradd, which is neither on PATH nor "
        "in /usr/sbin or /sbin (Debian: apt-get install passwd; or run the tests as a user other than root)")


def test_the_postgresql_store_keeps_the_same_rows_on_a_real_server(tmp_path, monkeypatch, capsys):
    pgserver = pytest.importorskip("pgserver", reason="pgserver (a PostgreSQL server wheel) is not installed")
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed")
    if os.name == "posix":
        folder, problem = postgres_system_user_problem(os.environ, os.geteuid(), _user_exists, _executable)
        if problem:
            pytest.skip(problem)
        if folder:
            monkeypatch.setenv("PATH", os.pathsep.join(filter(None, [os.environ.get("PATH"), folder])))
    server = pgserver.get_server(tmp_path / "pgdata", cleanup_mode="stop")
    try:
        url = server.get_uri()
        monkeypatch.setenv(store.URL_ENV, url)
        seeded_history(url, [10.0, 11.0, 12.0])  # the URL stands where a file path would
        with store.open_store(store.location()) as history:
            assert history.migrate() == store.SCHEMA_VERSION  # a second migration applies nothing
            assert [p.value for p in history.series("main", "flashmla-fp8-sm90", "throughput:requests_per_second")] == [
                10.0, 11.0, 12.0]
        assert main(["history"]) == 0
        assert "(3 runs on main)" in capsys.readouterr().out
    finally:
        server.cleanup()


def test_run_json_names_the_branch_of_a_ci_push_and_none_for_a_pull_request():
    from kvgate.runners.environment.ci import ci_branch

    assert ci_branch({"GITHUB_REF": "refs/heads/main"}) == "main"
    assert ci_branch({"GITHUB_REF": "refs/pull/7/merge"}) is None and ci_branch({}) is None
    assert record.is_main({"branch": "main"}) and not record.is_main({"branch": "mainline"}) and not record.is_main({})


# -- hostile stores (a damaged, hand-edited or foreign history; a location that is no store)

@pytest.mark.parametrize("where, said", [
    ("mysql://kvgate:m-secret@db.example/history", "names a history of scheme 'mysql'"),
    ("postgresql+psycopg://kvgate@db.example/history", "names a history of scheme 'postgresql+psycopg'"),
    ("POSTGRESQL://kvgate@db.example/history", "names a history of scheme 'POSTGRESQL'"),
    ("https://example.com/history.sqlite3", "names a history of scheme 'https'"),
    ("sqlite:/tmp/history.sqlite3", "names a history of scheme 'sqlite'"),
    (" postgresql://kvgate@db.example/history", "starts or ends with white space"),
    (":memory:", "is no file: a history kept there is lost when kvgate exits"),
    ("sqlite:///:memory:", "is no file: a history kept there is lost when kvgate exits"),
])
def test_attack_a_history_location_that_is_no_store_is_refused_not_a_local_file(where, said, tmp_path, monkeypatch,
                                                                                capsys):
    """A URL of a scheme kvgate does not keep a history in was taken for a SQLite file path: the gate of main
    recorded its run into a new local file named `mysql:/...` (a folder made on the way), said "recorded", and the
    row was lost with the runner. Refused, one line, the URL not shown (it may carry a password)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(store.URL_ENV, where)
    assert main(["history"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ERROR ") and err.count("\n") == 1 and said in err, err
    assert "secret" not in err and "db.example" not in err
    assert list(tmp_path.iterdir()) == []  # no file, no folder made


def test_a_sqlite_url_still_names_a_file(tmp_path):
    db = tmp_path / "h.sqlite3"
    seeded_history(f"sqlite://{db}", [10.0])
    assert db.is_file()


def test_a_store_whose_tables_were_dropped_or_altered_is_one_error_line(tmp_path, capsys):
    dropped, altered = tmp_path / "dropped.sqlite3", tmp_path / "altered.sqlite3"
    for db in (dropped, altered):
        seeded_history(db, [10.0, 11.0])
    with sqlite3.connect(dropped) as connection:
        connection.execute("DROP TABLE history_figures")
    with sqlite3.connect(altered) as connection:
        connection.execute("ALTER TABLE history_figures RENAME COLUMN value TO worth")
    for db, said in ((dropped, "cannot read the series (no such table: history_figures)"),
                     (altered, "cannot read the series flashmla-fp8-sm90 throughput:requests_per_second (no such "
                               "column: f.value)")):
        assert main(["history", "--db", str(db)]) == 2
        err = capsys.readouterr().err
        assert err == f"ERROR {db}: {said}. Is it a kvgate history store? Restore it from a copy, or move it away and " \
                      "let the next run of main start a new one\n"


@pytest.mark.parametrize("column, sql, said", [
    ("value", "'abc'", "its value is 'abc', not a finite number of a measure"),
    ("value", "x'00ff'", "its value is \"b'\\\\x00\\\\xff'\", not a finite number of a measure"),
    ("value", "9e999", "its value is 'inf', not a finite number of a measure"),
    ("value", "-9e999", "its value is '-inf', not a finite number of a measure"),
    ("value", "1.7e308", "its value is '1.7e+308', not a finite number of a measure"),
    ("low", "'x'", "its low is 'x', not a finite number of a measure"),
])
def test_attack_a_row_that_is_no_finite_number_is_named_not_a_traceback(column, sql, said, tmp_path, capsys):
    """A damaged or hand-edited row (text, a blob, infinity, a number no plot can scale) stopped `kvgate history`
    with a ValueError/TypeError from the table's formatting; now one ERROR line names the run and the fix."""
    db = tmp_path / "h.sqlite3"
    seeded_history(db, [10.0, 11.0, 12.0])
    with sqlite3.connect(db) as connection:
        run_id = connection.execute("SELECT run_id FROM history_figures WHERE rowid = 2").fetchone()[0]
        connection.execute(f"UPDATE history_figures SET {column} = {sql} WHERE rowid = 2")
    for argv in (["history", "--db", str(db)], ["history", "--db", str(db), "--svg", str(tmp_path / "t.svg")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err == (f"ERROR {db}: run '{run_id}' of main, flashmla-fp8-sm90 throughput:requests_per_second: "
                       f"{said}. Correct or delete that run's rows (history_runs id, history_figures run_id)\n")


def test_a_run_whose_environment_is_nested_too_deep_still_draws(tmp_path):
    db = tmp_path / "h.sqlite3"
    seeded_history(db, [10.0, 11.0])
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE history_runs SET environment = ?", ("[" * 100_000,))
    with store.open_store(str(db)) as history:
        assert [p.commit_url for p in history.series("main", "flashmla-fp8-sm90", "throughput:requests_per_second")
                ] == [None, None]


@pytest.mark.parametrize("name", ["x\n::error::forged", "c\r\n::add-mask::secret", "::stop-commands::token",
                                  "  ::warning::indented", "a\u202eb"])
def test_attack_a_stored_name_prints_no_workflow_command(name, tmp_path, capsys):
    """A cell or measure name from the store was printed as it was: its newline (or the name itself) opened a line
    with `::`, which GitHub Actions runs as a command in kvgate-history.yml's log (`::add-mask::`,
    `::stop-commands::`). Now a name that is not plain is printed quoted with its escapes."""
    db = tmp_path / "h.sqlite3"
    seeded_history(db, [10.0, 11.0], cell=name)
    seeded_history(db, [12.0], cell="ok", measure=name)
    assert main(["history", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    print(out)
    assert not [line for line in out.splitlines() if line.lstrip().startswith("::")]
    assert "\u202e" not in out and repr(name) in out


def test_the_same_ci_run_recorded_again_replaces_its_rows(tmp_path):
    """A re-run of main's gate job (the same workflow run, the same commit) added a second row of the same figures:
    one commit counted twice in every series. The newest recording of a CI run now replaces the earlier."""
    db = tmp_path / "h.sqlite3"

    def one(recorded_at: str, value: float, run_id: str, commit: str = "a" * 40) -> record.HistoryRun:
        return record.HistoryRun(recorded_at=recorded_at, branch="main", commit=commit, vllm_version=None,
                                 vllm_commit=None, passed=True, neutral=False, exit_status=0, run_folder="/tmp/kvgate-run",
                                 environment={"workflow_run_id": run_id},
                                 figures=(record.Figure(cell="c", measure="m", value=value),))

    with store.open_store(str(db)) as history:
        history.record(one("2026-10-01T00:00:00Z", 10.0, "7"))
        history.record(one("2026-10-01T01:00:00Z", 11.0, "7"))  # run 7 again: replaces
        history.record(one("2026-10-02T00:00:00Z", 12.0, "8"))  # another run of the same commit: kept
        history.record(one("2026-10-03T00:00:00Z", 13.0, "7", commit="b" * 40))
        assert [p.value for p in history.series("main", "c", "m")] == [11.0, 12.0, 13.0]
        assert history.runs("main") == 3
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT COUNT(*) FROM history_figures").fetchone()[0] == 3


def test_a_locked_store_says_so(tmp_path, capsys):
    db = tmp_path / "h.sqlite3"
    seeded_history(db, [10.0])
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        assert main(["history", "--db", str(db)]) == 2
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert capsys.readouterr().err == (f"ERROR {db}: cannot set up the history tables (database is locked). Another "
                                       "process holds it (a gate of main writing now?): try again when that ends\n")


def test_an_svg_that_cannot_be_written_is_one_error_line(tmp_path, capsys):
    """--svg naming a folder, or a path under a file, was a traceback (IsADirectoryError, FileExistsError)."""
    db = tmp_path / "h.sqlite3"
    seeded_history(db, [10.0])
    (tmp_path / "folder").mkdir()
    for target, reason in ((tmp_path / "folder", "Is a directory"), (db / "t.svg", "File exists")):
        assert main(["history", "--db", str(db), "--svg", str(target)]) == 2
        err = capsys.readouterr().err
        assert err == f"ERROR --svg: cannot write {target} ({reason}). Name a file in a folder kvgate can write\n"


def test_a_change_points_line_quotes_odd_stored_text():
    """`kvgate history --detect` prints one line per change point: its run's stored time and commits are quoted where
    they are not plain, as the table's are, so none opens a line with `::`."""
    points = [store.Point(recorded_at="2026-10-01\n::error::t", commit="c\n::add-mask::x", vllm_commit="::warning::v",
                          value=v, low=None, high=None) for v in (10.0, 10.0, 9.0, 9.0)]
    line = trends.describe("cell", "m", points, detect.ChangePoint(index=2, p_value=1e-6, mean_before=10.0,
                                                                   mean_after=9.0))
    print(line)
    assert "\n" not in line and "'2026-10-01\\n::error::t'" in line and "'c\\n::add-mask'" in line  # its first 12 characters
    assert "\"'::warning::v'\"" not in line and "'::warning::v'" in line


@pytest.mark.parametrize("finished_at", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_attack_a_run_time_past_the_calendar_in_utc_is_the_gates_time_not_a_traceback(finished_at, cpu_run, tmp_path,
                                                                                      capsys):
    """run.json `finished_at` at the calendar's edge with an offset (year 1 east of UTC, year 9999 west) read as a
    time but overflowed when moved to UTC: the gate of main stopped with an OverflowError traceback. Now it is a time
    that cannot be read, and the gate's own time stands, said so."""
    db = tmp_path / "history.sqlite3"
    run = run_naming(cpu_run, tmp_path, "main")
    info = json.loads((run / "run.json").read_text(encoding="utf-8"))
    info.pop("started_at", None)
    (run / "run.json").write_text(json.dumps({**info, "finished_at": finished_at}), encoding="utf-8")
    assert gate(cpu_run, run, db) == 0
    assert "run.json says neither when the run finished nor when it started" in capsys.readouterr().err
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT COUNT(*) FROM history_runs").fetchone()[0] == 1



@pytest.mark.parametrize("name", ["x\x1b[31mred\x07", "a\x00b", "f\x0cg", "<script>alert(1)</script>&]]>"])
def test_attack_stored_text_in_the_svg_is_well_formed_text_not_markup(name, tmp_path):
    """A cell, a measure or a run's time holding a control character (an ANSI escape, NUL, a form feed) went into the
    SVG as it was: XML forbids those characters, so the file was not well-formed and a browser drew an error page in
    its place. Now stored text is drawn as the table prints it (quoted with its escapes) and escaped as markup."""
    import xml.etree.ElementTree as ElementTree

    db, svg = tmp_path / "h.sqlite3", tmp_path / "t.svg"
    seeded_history(db, [10.0, 11.0], cell=name)
    seeded_history(db, [12.0], cell="ok", measure=name)
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE history_runs SET recorded_at = ? || recorded_at", (name,))
    assert main(["history", "--db", str(db), "--svg", str(svg)]) == 0
    root = ElementTree.fromstring(svg.read_text(encoding="utf-8"))
    namespace = "{http://www.w3.org/2000/svg}"
    assert {element.tag for element in root.iter()} <= {f"{namespace}{tag}" for tag in (
        "svg", "title", "text", "rect", "polyline", "polygon", "circle", "line", "a")}
    texts = " ".join(element.text or "" for element in root.iter())
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", texts)
    assert trends.shown(name) in texts


def test_attack_a_figure_past_what_the_history_reads_is_refused_before_it_is_recorded(cpu_run, tmp_path, capsys):
    """A throughput of 1e308 requests/s (finite, so the gate judged it) was recorded into the history, which then
    refused its own row on every read: `kvgate history` and every later gate of main exited 2 until someone edited
    the store by hand. Now the gate refuses to record it (one line, exit 2), and the history stays readable."""
    db = tmp_path / "history.sqlite3"
    seeded_history(db, [10.0])
    run = run_naming(cpu_run, tmp_path, "main")
    for path in (run / "cpu_attn-auto-cpu" / "throughput").glob("repeat-*.json"):
        path.write_text(json.dumps({**json.loads(path.read_text(encoding="utf-8")), "requests_per_second": 1e308}),
                        encoding="utf-8")
    assert gate(cpu_run, run, db) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"ERROR {db}: cannot record the run: cpu_attn-auto-cpu throughput:requests_per_second has the value 1e+308, "
        "not a finite number of a measure")
    assert main(["history", "--db", str(db)]) == 0


def test_attack_a_sqlite_database_of_another_program_is_refused_untouched(tmp_path, capsys):
    """`--db` naming another program's SQLite database (a typo, a wrong variable) had kvgate's tables created in it:
    the gate of main recorded its runs into that file, and `kvgate history` changed it to say "no runs". Now a
    database that holds tables but no kvgate migrations is refused, one line, and left as it was."""
    db = tmp_path / "other.sqlite3"
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    before = db.read_bytes()
    assert main(["history", "--db", str(db)]) == 2
    assert capsys.readouterr().err == (f"ERROR {db}: is a SQLite database of another program (its tables: users), not a "
                                       "kvgate history. Name the history's own file, e.g. reports/history.sqlite3\n")
    assert db.read_bytes() == before


def test_attack_the_names_an_unknown_cell_error_lists_are_quoted_where_not_plain(tmp_path, capsys):
    """`--cell` naming no series listed what is recorded as it was stored: a right-to-left override (or a `::`) in a
    stored name printed raw in the error line, reordering what the terminal or CI log shows. Now each recorded name is
    shown as the table shows it, quoted with its escapes where it is not plain."""
    db = tmp_path / "h.sqlite3"
    seeded_history(db, [10.0, 10.0], cell="a\u202eb")
    seeded_history(db, [11.0], cell="ok", measure="::warning::m")  # replaces the first run (the same CI run)
    for flag, recorded in (("--cell", "'a\\u202eb', ok"), ("--measure", "'::warning::m', throughput:requests_per_second")):
        assert main(["history", "--db", str(db), flag, "nope"]) == 2
        assert capsys.readouterr().err == f"ERROR {flag}: no series for 'nope' in {db}. Recorded: {recorded}\n"


@pytest.mark.parametrize("last", ["0", "-3"])
def test_a_last_of_no_runs_is_refused_not_an_empty_table(last, tmp_path, capsys):
    """`--last 0` or a negative count printed each table's header and no run, exit 0: a history that looked empty. Now
    it is bad input, one line."""
    db = tmp_path / "h.sqlite3"
    seeded_history(db, [10.0, 11.0])
    assert main(["history", "--db", str(db), "--last", last]) == 2
    assert capsys.readouterr() == ("", f"ERROR --last: {last} is not a count of runs of 1 or more. e.g. 20\n")


@needs_otava
def test_attack_a_series_whose_squares_overflow_is_refused_not_read_as_no_change(tmp_path, capsys):
    """A series near 1e160 (finite, below the plot's bound) overflowed the squares of the t-test Otava runs: a 10 %
    step went unflagged, exit 0, under a numpy RuntimeWarning. Now a figure past 1e150 is no figure of a measure: the
    store refuses to record it and names a stored one, as it does infinity."""
    db = tmp_path / "h.sqlite3"
    seeded_history(db, synthetic_history(np.random.default_rng(7), noise=0.01))
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE history_figures SET value = value * 1e160")
    assert main(["history", "--db", str(db), "--detect"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"ERROR {db}: run '") and captured.err.count("\n") == 1
    assert "not a finite number of a measure" in captured.err and "RuntimeWarning" not in captured.err
    with pytest.raises(InputError, match=re.escape("has the value 1e+160, not a finite number of a measure")):
        seeded_history(tmp_path / "new.sqlite3", [1e160])


def test_acknowledging_a_series_or_commit_the_history_does_not_hold_is_refused(tmp_path, capsys):
    """`--acknowledge` of a mistyped cell, measure or commit was stored and printed "acknowledged", exit 0, while
    the change point it meant stayed flagged, and the row acknowledged nothing. Now it is bad input, naming what the
    history holds; nothing is stored."""
    db = tmp_path / "h.sqlite3"
    seeded_history(db, [10.0, 11.0])
    measure = "throughput:requests_per_second"
    for argv, said in (
            (["flashmla-fp8-sm100", measure, commit_of(1)],
             f"ERROR --acknowledge: no series flashmla-fp8-sm100 {measure} of main in {db}. `kvgate history` lists "
             "the series recorded"),
            (["flashmla-fp8-sm90", measure, commit_of(1)[:12]],
             f"ERROR --acknowledge: {commit_of(1)[:12]} is no commit of a run of flashmla-fp8-sm90 {measure} on main in "
             f"{db}. Name the whole commit of the change point's first run (`kvgate history --detect` prints its first "
             "12 characters)")):
        assert main(["history", "--db", str(db), "--acknowledge", *argv]) == 2
        assert capsys.readouterr().err == said + "\n"
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT COUNT(*) FROM history_acknowledged").fetchone()[0] == 0
    assert main(["history", "--db", str(db), "--acknowledge", "flashmla-fp8-sm90", measure, commit_of(1)]) == 0


@pytest.mark.parametrize("where", ["typo/h.sqlite3", "dangling.sqlite3"])
def test_reading_a_history_that_does_not_exist_creates_nothing(where, tmp_path, monkeypatch, capsys):
    """`kvgate history --db` naming a file that does not exist (a typo, a link to nowhere) created it, and the folders
    on its way (or the file a dangling link names), to say "no runs of main recorded". Reading now creates nothing:
    one line names the file and how a history gets there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dangling.sqlite3").symlink_to(tmp_path / "nowhere.sqlite3")
    for argv in (["history", "--db", where], ["history", "--db", where, "--acknowledge", "c", "m", "a" * 40]):
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            f"ERROR {where}: holds no history: there is no such file. The gate of main records its runs there "
            f"(kvgate gate --history {where}); name the history with --db or {store.URL_ENV}\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dangling.sqlite3"]
