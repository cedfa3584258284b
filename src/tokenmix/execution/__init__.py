"""Where work runs: worker processes on this machine, or a Ray or Dask cluster, for every stage that runs tasks.

The floor under the cache builder and curation (and any other user: export, verify): the executor configs a run is
given, the ``TaskExecutor`` seam each engine implements, the local process pool whose workers exit with their parent,
and ``run_tasks``, which retries tasks the engine lost. It imports no stage of tokenmix, and no module outside it
imports Ray or Dask.
"""

from typing import TYPE_CHECKING

from tokenmix._lazy import lazy_exports

if TYPE_CHECKING:
    from tokenmix.execution.configs import ClusterExecutorConfig, DaskExecutorConfig, ExecutorConfig, LocalExecutorConfig, RayExecutorConfig
    from tokenmix.execution.extras import MissingExtraError, import_extra
    from tokenmix.execution.process_pool import LocalExecutor, run_here, worker_process_pool
    from tokenmix.execution.retrying import TaskInputError, run_tasks
    from tokenmix.execution.task_executor import TaskExecutor, TaskFuture

__all__ = [
    "ClusterExecutorConfig",
    "DaskExecutorConfig",
    "ExecutorConfig",
    "LocalExecutor",
    "LocalExecutorConfig",
    "MissingExtraError",
    "RayExecutorConfig",
    "TaskExecutor",
    "TaskFuture",
    "TaskInputError",
    "import_extra",
    "run_here",
    "run_tasks",
    "worker_process_pool",
]
_exports, __getattr__, __dir__ = lazy_exports(__name__, __file__)
