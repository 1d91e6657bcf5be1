"""The Lua lint (``.ci/lualint.py``, run by ``make lint``) passes, and catches what it names.

The package's scripts are checked as the server runs them (their includes
resolved). Each kind of problem the tool reports is shown caught in a small
script written here, next to the same script without the mistake, which
passes: a check that cannot fail would prove nothing.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import ModuleType

import pytest
from support.checkout import ROOT

from aiolock._scripts import parse_header, resolve

TOOL = ROOT / ".ci" / "lualint.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lualint", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("lualint", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


lualint = _load()


def test_the_package_scripts_pass_the_lint() -> None:
    """`python .ci/lualint.py` finds no problem in aiolock's scripts and exits 0."""
    done = subprocess.run(
        [sys.executable, str(TOOL)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "scripts checked, no problem" in done.stdout


HEADER = """\
-- BAD: a script written to be caught.
--
-- KEYS[1] lock: the lock key
-- ARGV[1] token: the token
-- return 1 or 0
"""

GOOD = """\
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
    return 1
end
return 0
"""

#: (what is wrong, the script's body with that mistake, a piece of the report).
BAD = [
    ("a parse error", GOOD.replace("then", ""), "does not parse"),
    ("an undefined global", GOOD.replace("== ARGV[1]", "== ARGV[1] or helde"), "'helde'"),
    ("an assignment to a global", GOOD.replace("local held", "held"), "assigns the global"),
    ("an unused local", "local spare = 1\n" + GOOD, "unused local 'spare'"),
    (
        "an unused parameter",
        "local function f(a, b) return a end\nlocal x = f(1)\n" + GOOD.replace("0\n", "x\n"),
        "unused parameter 'b'",
    ),
    (
        "a local redeclared in one scope",
        GOOD.replace(
            "local held = redis.call('GET', KEYS[1])",
            "local held = redis.call('GET', KEYS[1])\nlocal held = held",
        ),
        "'held' declared again in the same scope",
    ),
    ("a key the header does not declare", GOOD.replace("KEYS[1]", "KEYS[2]"), "KEYS[2]"),
    ("a declared argument never read", GOOD.replace("ARGV[1]", "'x'"), "never reads them"),
    ("syntax newer than Lua 5.1", GOOD.replace("return 0", "return 7 // 2"), "not Lua 5.1"),
]


def test_a_clean_script_passes() -> None:
    """The script the bad cases start from passes: each problem below is its mistake."""
    text = HEADER + GOOD
    assert lualint.check(text, "good", parse_header(text)) == []


@pytest.mark.parametrize(("wrong", "body", "said"), BAD, ids=[case[0] for case in BAD])
def test_the_lint_catches(wrong: str, body: str, said: str) -> None:
    """A script with one mistake is reported, and the report says what it is."""
    text = HEADER + body
    problems = lualint.check(text, "bad", parse_header(text))
    assert problems, f"{wrong} was not caught"
    assert any(said in problem for problem in problems), problems


def test_a_shadowing_local_in_an_inner_scope_is_allowed() -> None:
    """A local of the same name in a nested block is a new variable, not a redeclaration."""
    body = GOOD.replace("    return 1\n", "    local held = 1\n    return held\n")
    text = HEADER + body
    assert lualint.check(text, "inner", parse_header(text)) == []


def test_the_lint_reads_the_script_with_its_includes_resolved() -> None:
    """A library's functions a script includes count as declared; an unused one is reported."""
    uses = (
        HEADER + "--@include clock\nreturn now_ms() > 0 and redis.call('GET', KEYS[1]) == ARGV[1]"
    )
    assert lualint.check(resolve(uses), "uses", parse_header(uses)) == []
    unused = HEADER + "--@include clock\nreturn redis.call('GET', KEYS[1]) == ARGV[1]"
    assert any(
        "unused function 'now_ms'" in p
        for p in lualint.check(resolve(unused), "unused", parse_header(unused))
    )
