"""Lint aiolock's Lua scripts as the server runs them (their includes resolved).

Usage: ``python .ci/lualint.py`` (``make lint`` runs it). It checks every
script of ``aiolock/_lua/`` after :func:`aiolock._scripts.resolve`, with
luaparser (the ``dev`` extra), for what the server would refuse or what hides
a mistake:

- a parse error, or syntax that Lua 5.1 (the scripting engine of Redis and
  Valkey) does not have: ``goto``, integer division, bitwise operators;
- a read of a global that Redis's Lua environment does not offer, and any
  assignment to a global (the server refuses to create globals);
- a local (a variable, a function, a parameter, a loop variable) that is
  never read; a name that starts with ``_`` is exempt;
- a local declared again in the same scope;
- a ``KEYS[n]`` or ``ARGV[n]`` that the script's header does not declare, and
  a declared one the script never reads by its number.

It also checks that every ``.lua`` file is either a script that
``aiolock._scripts.SCRIPTS`` loads or a library some script includes, so
that no file escapes the checks above. It prints one line per problem and
exits 1 if there is any.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from luaparser import ast, astnodes

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aiolock import _scripts  # noqa: E402 - after the repository is on the path

#: What a script may read without declaring it: Redis's and Valkey's Lua 5.1 globals.
GLOBALS = frozenset(
    {
        # the server's
        "redis",
        "KEYS",
        "ARGV",
        "cjson",
        "cmsgpack",
        "struct",
        "bit",
        # the standard libraries the server loads
        "string",
        "table",
        "math",
        "os",
        # the base functions it keeps
        "assert",
        "error",
        "getmetatable",
        "ipairs",
        "next",
        "pairs",
        "pcall",
        "rawequal",
        "rawget",
        "rawset",
        "select",
        "setmetatable",
        "tonumber",
        "tostring",
        "type",
        "unpack",
        "xpcall",
        "_G",
    }
)

#: Syntax that came after Lua 5.1 (luaparser reads Lua 5.3).
_NOT_51 = (
    astnodes.Goto,
    astnodes.Label,
    astnodes.FloorDivOp,
    astnodes.BAndOp,
    astnodes.BOrOp,
    astnodes.BXorOp,
    astnodes.BShiftLOp,
    astnodes.BShiftROp,
    astnodes.UBNotOp,
)


@dataclass
class _Local:
    name: str
    line: int
    what: str
    read: bool = False


@dataclass
class _Scope:
    names: dict[str, _Local] = field(default_factory=dict)


class _Checker:
    """Walks one chunk with its scopes, noting problems and the KEYS/ARGV read by number."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.problems: list[str] = []
        self.scopes: list[_Scope] = []
        #: The line of the statement being read (a name carries none of its own).
        self.line = 0
        #: The literal indices read: {"KEYS": {1, 2}, "ARGV": {1}}.
        self.indices: dict[str, set[int]] = {"KEYS": set(), "ARGV": set()}

    def problem(self, node: astnodes.Node, text: str) -> None:
        self.problems.append(f"{self.where}:{node.line or self.line}: {text}")

    # -- scopes -------------------------------------------------------------------------

    def open(self) -> None:
        self.scopes.append(_Scope())

    def close(self) -> None:
        scope = self.scopes.pop()
        for local in scope.names.values():
            if not local.read and not local.name.startswith("_"):
                self.problems.append(
                    f"{self.where}:{local.line}: unused {local.what} {local.name!r}"
                )

    def declare(self, name: astnodes.Name, what: str) -> None:
        scope = self.scopes[-1]
        old = scope.names.get(name.id)
        if old is not None and not name.id.startswith("_"):
            self.problem(
                name, f"{what} {name.id!r} declared again in the same scope (line {old.line})"
            )
            if not old.read and not old.name.startswith("_"):
                self.problem(name, f"unused {old.what} {old.name!r} (line {old.line})")
        scope.names[name.id] = _Local(name.id, name.line or self.line, what)

    def lookup(self, name: str) -> _Local | None:
        for scope in reversed(self.scopes):
            if name in scope.names:
                return scope.names[name]
        return None

    # -- the walk -----------------------------------------------------------------------

    def chunk(self, tree: astnodes.Chunk) -> None:
        self.open()
        self.block(tree.body)
        self.close()

    def block(self, block: astnodes.Block) -> None:
        for statement in block.body:
            self.visit(statement)

    def scoped(self, block: astnodes.Block) -> None:
        self.open()
        self.block(block)
        self.close()

    def function(self, args: list[astnodes.Node], body: astnodes.Block, method: bool) -> None:
        self.open()
        if method:
            self.scopes[-1].names["self"] = _Local("self", 0, "parameter", read=True)
        for arg in args:
            if isinstance(arg, astnodes.Name):
                self.declare(arg, "parameter")
        self.block(body)
        self.close()

    def visit(self, node: object) -> None:
        if isinstance(node, list):
            for item in node:
                self.visit(item)
            return
        if not isinstance(node, astnodes.Node):
            return
        if node.line:
            self.line = node.line
        if isinstance(node, _NOT_51):
            self.problem(node, f"{type(node).__name__} is not Lua 5.1, the server's Lua")
        if isinstance(node, astnodes.LocalAssign):
            self.visit(node.values)
            for target in node.targets:
                self.declare(target, "local")
        elif isinstance(node, astnodes.LocalFunction):
            self.declare(node.name, "function")
            self.function(node.args, node.body, method=False)
        elif isinstance(node, astnodes.Function):
            self.assign(node.name)
            self.function(node.args, node.body, method=False)
        elif isinstance(node, astnodes.Method):
            self.visit(node.source)
            self.function(node.args, node.body, method=True)
        elif isinstance(node, astnodes.AnonymousFunction):
            self.function(node.args, node.body, method=False)
        elif isinstance(node, astnodes.Assign):
            self.visit(node.values)
            for target in node.targets:
                self.assign(target)
        elif isinstance(node, astnodes.Fornum):
            self.visit([node.start, node.stop, node.step])
            self.open()
            self.declare(node.target, "loop variable")
            self.block(node.body)
            self.close()
        elif isinstance(node, astnodes.Forin):
            self.visit(node.iter)
            self.open()
            for target in node.targets:
                self.declare(target, "loop variable")
            self.block(node.body)
            self.close()
        elif isinstance(node, astnodes.While):
            self.visit(node.test)
            self.scoped(node.body)
        elif isinstance(node, astnodes.Repeat):
            self.open()  # (the condition sees the body's locals)
            self.block(node.body)
            self.visit(node.test)
            self.close()
        elif isinstance(node, astnodes.If | astnodes.ElseIf):
            self.visit(node.test)
            self.scoped(node.body)
            if isinstance(node.orelse, astnodes.Block):
                self.scoped(node.orelse)
            else:
                self.visit(node.orelse)
        elif isinstance(node, astnodes.Do):
            self.scoped(node.body)
        elif isinstance(node, astnodes.Block):
            self.scoped(node)
        elif isinstance(node, astnodes.Name):
            self.read(node)
        elif isinstance(node, astnodes.Index):
            self.index(node)
        elif isinstance(node, astnodes.Invoke):
            self.visit(node.source)  # (node.func is the method's name)
            self.visit(node.args)
        elif isinstance(node, astnodes.Table):
            for item in node.fields:
                if item.between_brackets:
                    self.visit(item.key)
                self.visit(item.value)
        else:
            for child in _children(node):
                self.visit(child)

    def read(self, name: astnodes.Name) -> None:
        local = self.lookup(name.id)
        if local is not None:
            local.read = True
        elif name.id not in GLOBALS:
            self.problem(name, f"reads the undefined global {name.id!r}")

    def assign(self, target: astnodes.Node) -> None:
        if isinstance(target, astnodes.Name):
            if self.lookup(target.id) is None:
                self.problem(target, f"assigns the global {target.id!r} (the server refuses)")
        else:
            self.visit(target)  # an index: its table and key are read

    def index(self, node: astnodes.Index) -> None:
        self.visit(node.value)
        if node.notation == astnodes.IndexNotation.SQUARE:
            self.visit(node.idx)
            value, idx = node.value, node.idx
            if (
                isinstance(value, astnodes.Name)
                and value.id in self.indices
                and self.lookup(value.id) is None
                and isinstance(idx, astnodes.Number)
            ):
                self.indices[value.id].add(int(idx.n))


def _children(node: astnodes.Node) -> Iterator[object]:
    """The nodes (and lists of nodes) that hang from ``node``."""
    for key, value in vars(node).items():
        if key.startswith("_") or key == "comments":
            continue
        if isinstance(value, astnodes.Node | list):
            yield value


def check(text: str, where: str, header: _scripts.Header | None = None) -> list[str]:
    """The problems of the Lua chunk ``text`` (``where`` names it); with ``header``, its KEYS/ARGV.

    ``header`` is what the script declares (:func:`aiolock._scripts.parse_header`):
    every ``KEYS[n]``/``ARGV[n]`` read by its number must be declared, and
    every declared one read.
    """
    try:
        tree = ast.parse(text)
    except ast.SyntaxException as exc:
        return [f"{where}: does not parse: {exc}"]
    checker = _Checker(where)
    checker.chunk(tree)
    problems = checker.problems
    if header is not None:
        declared = {
            "KEYS": (len(header.keys), header.more_keys is not None),
            "ARGV": (len(header.args), header.more_args is not None),
        }
        for table, (count, more) in declared.items():
            read = checker.indices[table]
            beyond = sorted(i for i in read if i > count or i < 1)
            if beyond and not more:
                problems.append(f"{where}: reads {table}{beyond} that its header does not declare")
            unread = sorted(set(range(1, count + 1)) - read)
            if unread:
                problems.append(f"{where}: declares {table}{unread} and never reads them")
    return problems


def check_package() -> tuple[int, list[str]]:
    """Check every script of the package, and that every file is checked; (scripts, problems)."""
    problems: list[str] = []
    lua = ROOT / "aiolock" / "_lua"
    for path, script in _scripts.SCRIPTS.items():
        source = _scripts.lua_source(path)
        problems += check(script.text, f"aiolock/_lua/{path}", _scripts.parse_header(source, path))
    files = {p.relative_to(lua).as_posix() for p in lua.rglob("*.lua")}
    scripts = {f for f in files if not f.startswith("lib/")}
    problems += [
        f"aiolock/_lua/{f}: not a script of SCRIPTS"
        for f in sorted(scripts - set(_scripts.SCRIPTS))
    ]
    included = {
        line.split()[1]
        for f in files
        for line in (lua / f).read_text(encoding="utf-8").splitlines()
        if line.startswith("--@include ")
    }
    libraries = {f[len("lib/") : -len(".lua")] for f in files if f.startswith("lib/")}
    problems += [
        f"aiolock/_lua/lib/{name}.lua: included by no script"
        for name in sorted(libraries - included)
    ]
    return len(_scripts.SCRIPTS), problems


def main() -> int:
    """Check the package's scripts; print the problems; 1 if there are any."""
    count, problems = check_package()
    for problem in problems:
        print(problem)
    if problems:
        print(f"lualint: {len(problems)} problems in {count} scripts", file=sys.stderr)
        return 1
    print(f"lualint: {count} scripts checked, no problem")
    return 0


if __name__ == "__main__":
    sys.exit(main())
