"""``airflow celery worker`` for the 3.1.7 stack (scripts/airflow-stack.sh, TPU_RL_STACK=af31), with the fix of
apache/airflow#59707 (PR 65826) applied to the celery provider Composer's 3.1.7 build ships (3.16.0).

The stack tells its two workers apart with ``--celery-hostname``. With it, provider 3.16.0 first asks the broker
whether a worker of that name runs, on the very app it then starts the worker with; that leaves kombu's
process-global connection pools warm, and the prefork pool's children inherit a channel in the middle of a read
and hang at their start: the worker receives tasks and never runs one. Composer's workers are told apart by their
pods, not by that flag, so they never meet it; the stack asks as the fixed provider does (a throwaway app, the
pools reset after) and is otherwise Airflow 3.1.7 unchanged.

    python scripts/celery_worker_af31.py [airflow celery worker arguments]
"""

from __future__ import annotations

import sys

import kombu.pools
from celery import Celery


def inspect_on_a_throwaway_app(app: Celery) -> None:
    """The worker-name check of provider 3.16.0 asks ``app.control.inspect()`` first: answer that one question from
    another app (the worker itself asks its own app later, e.g. mingle's ``hello``)."""
    own = app.control.inspect

    def inspect(*args, **kwargs):
        app.control.inspect = own
        throwaway = Celery()
        throwaway.conf.update(app.conf)
        asked = throwaway.control.inspect(*args, **kwargs)

        def active_queues():
            try:
                return asked.active_queues()
            finally:
                throwaway.close()
                kombu.pools.reset()

        return type("Inspect", (), {"active_queues": staticmethod(active_queues)})()

    app.control.inspect = inspect


def main() -> None:
    from airflow.__main__ import main as airflow_main
    from airflow.providers.celery.executors.celery_executor import app

    inspect_on_a_throwaway_app(app)
    sys.argv = ["airflow", "celery", "worker", *sys.argv[1:]]
    airflow_main()


if __name__ == "__main__":
    main()
