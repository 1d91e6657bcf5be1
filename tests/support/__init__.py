"""Helpers shared by the test modules, one module per concern; fixtures live in ``conftest.py``.

- ``support.loops``: the event loops the suite runs on.
- ``support.timing``: polling until true, the loop's lateness, ending tasks, the random draw.
- ``support.servers``: the server's features, private servers, clients, server states.
- ``support.leaks``: tasks, listeners and connections left behind.
- ``support.locks``: key names, critical sections, events, losses, error messages.
- ``support.checkout``: the repository's root and examples, other processes, served apps.
- ``support.contract``: the contract suite's subjects (loaded as a plugin by ``conftest.py``).

``tests/`` is on ``sys.path`` (pytest puts it there for ``conftest.py``), so
every test module, in whichever folder, imports ``from support.<module> import ...``.
"""
