"""The commands the README and the examples show, run as written.

Every fenced block of README.md marked ``runnable`` (```` ```python runnable ````,
```` ```sh runnable ````; ``background`` for a command that serves until
stopped), and each web example's "Run it" lines, are run here in order, from
the repository's root, with the interpreter and the ``aiolock`` command of the
test's environment. Only the ports change: the documented ones (6379 for the
server, 8000 and 8080 for the apps, 9000 for the partner's stand-in) become
free ones, so that a machine where something already listens there still
runs the test. A ``curl`` line is sent with ``urllib`` (the machine need not
have curl), and its answer must be a success. Every process started is
stopped at the end.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.checkout import ROOT

from aiolock.testing import free_port

README = ROOT / "README.md"
WEB_EXAMPLES = ("fastapi_app.py", "aiohttp_app.py")
#: How long a started process may take to listen, and a command to end.
BOUND = 30.0

_RUNNABLE = re.compile(
    r"^```(?P<language>\w+) runnable(?P<flags>[^\n]*)\n(?P<body>.*?)^```$", re.M | re.S
)


@dataclass
class Shell:
    """Runs documented lines with the documented ports replaced by free ones."""

    ports: dict[int, int] = field(default_factory=dict)
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def port(self, documented: int) -> int:
        if documented not in self.ports:
            self.ports[documented] = free_port()
        return self.ports[documented]

    def rewrite(self, text: str) -> str:
        """``text`` with every documented address on its free port."""
        text = text.replace("127.0.0.1:6379", f"127.0.0.1:{self.port(6379)}")
        for documented in (8000, 8080, 9000):
            text = text.replace(f"localhost:{documented}", f"127.0.0.1:{self.port(documented)}")
        return text

    def env(self, line: str) -> dict[str, str]:
        """The environment of a documented line: the test's interpreter first on PATH."""
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        env["PARTNER_URL"] = f"http://127.0.0.1:{self.port(9000)}"
        if "examples/partner.py" in line:
            env["PORT"] = str(self.port(9000))
        for name, documented in (("fastapi_app.py", 8000), ("aiohttp_app.py", 8080)):
            if name in line:
                env["PORT"] = str(self.port(documented))
        return env

    def listening_port(self, line: str) -> int:
        """The port a background line serves on."""
        if line.startswith("aiolock server"):
            return self.port(6379)
        if "examples/partner.py" in line:
            return self.port(9000)
        for name, documented in (("fastapi_app.py", 8000), ("aiohttp_app.py", 8080)):
            if name in line:
                return self.port(documented)
        raise AssertionError(f"no port known for the background line {line!r}")

    def command(self, line: str) -> str:
        line = self.rewrite(line)
        if line.startswith("aiolock server"):
            line += f" --port {self.port(6379)}"
        return re.sub(r"(^|\s)python(\s)", rf"\g<1>{shlex.quote(sys.executable)}\g<2>", line)

    def background(self, line: str) -> None:
        """Start a line that serves until stopped; wait until it listens."""
        port = self.listening_port(line)
        proc = subprocess.Popen(  # noqa: S602 - the documented shell line
            self.command(line),
            shell=True,
            cwd=ROOT,
            env=self.env(line),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.started.append(proc)
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                error = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"{line!r} exited ({proc.returncode}): {error[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        pytest.fail(f"{line!r} did not listen on {port} within {BOUND} s")

    def curl(self, line: str) -> object:
        """Send a documented ``curl [-X METHOD] 'URL'`` line; its JSON answer (a 2xx)."""
        words = shlex.split(self.rewrite(line))
        assert words[0] == "curl", line
        method = words[words.index("-X") + 1] if "-X" in words else "GET"
        url = words[-1]
        if not url.startswith("http"):
            url = f"http://{url}"
        request = urllib.request.Request(url, method=method)  # noqa: S310 - loopback
        with urllib.request.urlopen(request, timeout=BOUND) as answer:  # noqa: S310
            assert 200 <= answer.status < 300, (line, answer.status)
            return json.loads(answer.read() or b"null")

    def run(self, line: str) -> str:
        """Run a documented line to its end; its output (it must succeed)."""
        if line.startswith("curl "):
            return json.dumps(self.curl(line))
        result = subprocess.run(  # noqa: S602 - the documented shell line
            self.command(line),
            shell=True,
            cwd=ROOT,
            env=self.env(line),
            capture_output=True,
            text=True,
            timeout=BOUND,
            check=False,
        )
        assert result.returncode == 0, (line, result.stdout, result.stderr)
        return result.stdout

    def python(self, source: str, tmp: Path) -> str:
        """Run a documented Python block as a file; its output (it must succeed)."""
        script = tmp / "block.py"
        script.write_text(self.rewrite(source))
        result = subprocess.run(
            [sys.executable, str(script)],
            cwd=ROOT,
            env=self.env(""),
            capture_output=True,
            text=True,
            timeout=BOUND,
            check=False,
        )
        assert result.returncode == 0, (source, result.stdout, result.stderr)
        return result.stdout

    def stop(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.started:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


@pytest.fixture
def shell() -> Iterator[Shell]:
    runner = Shell()
    yield runner
    runner.stop()


def run_lines(shell: Shell, text: str) -> list[str]:
    """Run each line of a documented command block; the outputs of those that end."""
    outputs = []
    for line in (raw.strip() for raw in text.strip().splitlines()):
        if not line or line.startswith("#"):
            continue
        if line.endswith("&"):
            shell.background(line[:-1].strip())
        else:
            outputs.append(shell.run(line))
    return outputs


def test_the_readmes_runnable_blocks_run_as_written(shell: Shell, tmp_path: Path) -> None:
    """The server, the quickstart, the Semaphore and ReadWriteLock block, the command line."""
    blocks = list(_RUNNABLE.finditer(README.read_text()))
    assert len(blocks) >= 4, "the README lost its runnable blocks"
    printed = []
    for block in blocks:
        language, flags, body = block["language"], block["flags"].split(), block["body"]
        if language == "python":
            printed.append(shell.python(body, tmp_path))
        elif "background" in flags:
            for line in body.strip().splitlines():
                shell.background(line.split("#")[0].strip())
        else:
            printed += run_lines(shell, body)
    said = re.search(r"It prints `([^`]*)`", README.read_text())
    assert said is not None
    assert said[1] in printed[0], printed  # the quickstart prints what the README says
    assert "report done" in "".join(printed)  # aiolock run ran the command


@pytest.mark.parametrize("example", WEB_EXAMPLES)
def test_a_web_examples_run_lines_run_as_written(shell: Shell, example: str) -> None:
    """The server, the partner's stand-in, the app and its requests, from the docstring."""
    docstring = (ROOT / "examples" / example).read_text().split('"""')[1]
    block = docstring.split("runs these lines as written)::", 1)[1].split("\n\n")[1]
    lines = [line.strip() for line in block.splitlines()]
    assert any(line.startswith("curl") for line in lines), block
    outputs = [json.loads(out) for out in run_lines(shell, block)]
    restocked, bought, quoted = outputs
    assert restocked == {"item": "phone", "stock": 10}, restocked
    assert bought["item"] == "phone", bought
    assert quoted["item"] == "phone", quoted
    assert quoted["price"] > 0, quoted
