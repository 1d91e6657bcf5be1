"""The package as PyPI and a user get it: built, checked, installed into a fresh venv.

One build (wheel and sdist, ``python -m build --no-isolation``) serves every
test here. The long description is the README with its relative links made
absolute by the substitutions in ``pyproject.toml``: every link of it must
be absolute and, where it points into the repository, name a file (and a
heading) that exists. The wheel must install into a fresh venv (its
dependencies from the package index) and import.
"""

from __future__ import annotations

import email
import email.policy
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from support.checkout import ROOT
from test_docs import _anchors
from test_pytest_plugin import docs_example

import aiolock
from aiolock.testing import find_server_binary

pytestmark = pytest.mark.heavy  # builds, and installs into a venv: after the rest

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
_LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def _source_url() -> str:
    return str(PYPROJECT["project"]["urls"]["Source"]).rstrip("/")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and sdist of the working tree, built once."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def _wheel(dist: Path) -> Path:
    [wheel] = dist.glob("*.whl")
    return wheel


def _sdist(dist: Path) -> Path:
    [sdist] = dist.glob("*.tar.gz")
    return sdist


def _metadata(dist: Path) -> email.message.EmailMessage:
    with zipfile.ZipFile(_wheel(dist)) as wheel:
        [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        text = wheel.read(name).decode()
    message = email.message_from_string(text, policy=email.policy.default)
    assert isinstance(message, email.message.EmailMessage)
    return message


def test_twine_check_passes(dist: Path) -> None:
    """``twine check`` accepts the wheel and the sdist (the long description renders)."""
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_metadata_names_version_urls_and_license(dist: Path) -> None:
    """The version is the package's; the project URLs are there; the readme is Markdown."""
    meta = _metadata(dist)
    assert meta["Version"] == aiolock.__version__
    assert meta["Description-Content-Type"] == "text/markdown"
    urls = {
        value.split(",", 1)[0].strip(): value.split(",", 1)[1].strip()
        for value in meta.get_all("Project-URL") or []
    }
    assert set(urls) >= {"Documentation", "Changelog", "Source", "Issues"}, urls
    assert all(u.startswith(_source_url()) for u in urls.values()), urls
    requires = meta.get_all("Requires-Dist") or []
    runtime = sorted(
        r.split(";")[0].split(">")[0].split("[")[0].strip() for r in requires if "extra ==" not in r
    )
    assert runtime == ["anyio", "redis"], requires


def test_every_link_of_the_long_description_is_absolute_and_resolves(dist: Path) -> None:
    """No relative link is left; each link into the repository names a file (and heading)."""
    body = _metadata(dist).get_content()
    targets = [m["target"] for m in _LINK.finditer(body)]
    assert len(targets) > 15, "the long description has hardly any links: is it the README?"
    relative = [t for t in targets if not t.startswith(("https://", "http://"))]
    assert relative == [], f"relative links break on PyPI: {relative}"
    base = _source_url()
    owner_repo = urlsplit(base).path.strip("/")
    raw = f"https://raw.githubusercontent.com/{owner_repo}/main/"
    blob = f"{base}/blob/main/"
    broken = []
    for target in targets:
        path, _, anchor = target.partition("#")
        if target.startswith(raw):
            file = ROOT / path.removeprefix(raw)
        elif target.startswith(blob):
            file = ROOT / path.removeprefix(blob)
        elif path in (base, f"{base}/"):
            file = ROOT / "README.md"
        else:
            continue  # outside the repository (redis.io, GitHub issues of peers, ...)
        if not file.is_file():
            broken.append(f"{target}: no {file.relative_to(ROOT)}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert broken == [], broken


def test_the_sdist_carries_the_package_and_tests_but_no_benchmark_results(dist: Path) -> None:
    """The sdist: the package, its tests, README, CHANGELOG; no benchmarks, charts or docs."""
    with tarfile.open(_sdist(dist)) as sdist:
        names = [n.split("/", 1)[1] for n in sdist.getnames() if "/" in n]
    tops = {n.split("/", 1)[0] for n in names}
    assert {"aiolock", "tests", "README.md", "CHANGELOG.md", "pyproject.toml"} <= tops, tops
    assert "benchmarks" not in tops
    assert not [n for n in names if n.endswith((".png", ".json"))], "results in the sdist"
    assert "aiolock/py.typed" in names


def test_the_wheel_carries_every_lua_script(dist: Path) -> None:
    """Every ``.lua`` file of ``aiolock/_lua/`` is in the wheel (the scripts load from them)."""
    lua = ROOT / "aiolock" / "_lua"
    files = {f"aiolock/_lua/{p.relative_to(lua).as_posix()}" for p in lua.rglob("*.lua")}
    assert len(files) > 20
    with zipfile.ZipFile(_wheel(dist)) as wheel:
        assert files <= set(wheel.namelist()), files - set(wheel.namelist())


def _pip_install(python: Path, *requirements: str) -> None:
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *requirements,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed (its dependencies from the package index)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    _pip_install(venv / "bin" / "python", str(_wheel(dist)))
    return venv


def test_the_wheel_installs_into_a_fresh_venv_and_imports(venv: Path) -> None:
    """A fresh venv, ``pip install`` of the wheel (dependencies from the index), then import."""
    python = venv / "bin" / "python"
    shown = subprocess.run(
        [
            str(python),
            "-c",
            "import aiolock, aiolock.backoff, aiolock.testing; print(aiolock.__version__)",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.stdout.strip() == aiolock.__version__
    cli = subprocess.run(
        [str(venv / "bin" / "aiolock"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert "usage" in cli.stdout.lower()


def test_the_installed_wheel_gives_pytest_its_fixtures(venv: Path, tmp_path: Path) -> None:
    """The wheel's ``pytest11`` entry point gives a user's tests the fixtures, with no set-up.

    pytest and pytest-asyncio are installed beside the wheel, and the test
    file of docs/testing.md runs in a directory with no conftest: it passes.
    With the plugin turned off by its entry point's name, the fixtures are
    gone, so it was the entry point that gave them.
    """
    python = venv / "bin" / "python"
    _pip_install(python, "pytest", "pytest-asyncio")
    (tmp_path / "test_locks.py").write_text(docs_example(), encoding="utf-8")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n", encoding="utf-8"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}
    env["AIOLOCK_SERVER_BIN"] = find_server_binary()  # the venv has no server of its own

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-W", "error", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    done = run()
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b2 passed\b", done.stdout), done.stdout
    off = run("-p", "no:aiolock.testing.pytest_plugin")
    assert off.returncode == 1, off.stdout + off.stderr
    assert "fixture 'aiolock_proxy' not found" in off.stdout
