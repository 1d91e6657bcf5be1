"""A Celery app whose beat must run on one host at a time: run it under ``aiolock run --elect``.

Start the same command on every host that may run the beat; one of them
leads and runs ``celery beat``, the others wait as standbys and take over
when it stops or dies (``docs/recipes.md``)::

    CELERY_BROKER_URL=redis://localhost:6379/0 AIOLOCK_URL=redis://localhost:6379/0 \\
        aiolock run --elect --ttl 10 celery-beat -- \\
        celery -A celery_beat --workdir examples beat --schedule /tmp/celerybeat-schedule

``tests/project/test_recipes.py`` runs two such commands against a real server.
"""

from __future__ import annotations

import os

from celery import Celery

app = Celery("celery_beat", broker=os.environ.get("CELERY_BROKER_URL", "redis://localhost:6379/0"))
app.conf.beat_schedule = {
    "refresh-rates": {
        "task": "celery_beat.refresh_rates",
        "schedule": float(os.environ.get("REFRESH_EVERY", "60")),  # seconds
    },
}


@app.task  # type: ignore[untyped-decorator]
def refresh_rates() -> None:
    """Stands for the periodic task: one message per tick of the beat that leads."""
