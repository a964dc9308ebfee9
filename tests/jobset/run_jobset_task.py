"""A task process for test_killed_while_waiting_reattaches_without_resubmitting: runs the operator
(submit, defer, trigger) until the test kills it with SIGKILL.

    run_jobset_task.py NAME RUN_SECONDS
"""

import sys

from jobset_helpers import CONN_ID, run_operator, tpu_jobset

from tpu_rl.operators.jobset import JobSetOperator
from tpu_rl_testing import TaskInstanceStandIn, task_context

name, run_seconds = sys.argv[1], float(sys.argv[2])
op = JobSetOperator(task_id="train", manifest=tpu_jobset(name, run_seconds=run_seconds), kubernetes_conn_id=CONN_ID)
run_operator(op, task_context(TaskInstanceStandIn("jobset_tests", f"manual__{name}", "train", 1)))
