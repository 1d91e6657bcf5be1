"""The checkout and the programs a test runs beside itself.

The repository's root and its examples, other Python processes that import
this checkout's aiolock, and a web app served in-process by uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import uvicorn

from support.timing import eventually

__all__ = ["EXAMPLES", "ROOT", "load_example", "serve_with_uvicorn", "start_python"]


#: The checkout's root (``tests/support/`` is two folders down): other Python processes import
#: its aiolock, and tests read its files.
ROOT = Path(__file__).resolve().parents[2]

#: The repository's ``examples/`` folder.
EXAMPLES = ROOT / "examples"


def load_example(filename: str) -> ModuleType:
    """Import ``examples/<filename>`` by path (examples are not a package)."""
    path = EXAMPLES / filename
    spec = importlib.util.spec_from_file_location(f"{path.stem}_example", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def start_python(
    code: str, *args: str, stdout: int | None = None
) -> asyncio.subprocess.Process:
    """Run ``code`` with ``args`` in another Python process that imports this checkout's aiolock."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        *args,
        stdout=stdout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


#: Bounds on starting and stopping an in-process web server.
_STARTUP = 10.0


_SHUTDOWN = 10.0


@contextlib.asynccontextmanager
async def serve_with_uvicorn(app: Any) -> AsyncIterator[str]:
    """Serve an ASGI app in-process with uvicorn (lifespan on); yield its base URL."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        lifespan="on",
        log_config=None,
        log_level="warning",
        access_log=False,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(), name="test-uvicorn")
    try:
        await eventually(lambda: server.started or task.done(), "uvicorn to start", _STARTUP, 0.01)
        if task.done():
            await task
            pytest.fail("uvicorn stopped during startup")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        async with asyncio.timeout(_SHUTDOWN):
            await task
