"""The task registry: one `TaskSpec` per task (translation, lm, classification, mlm, embedding).

`registry.TASKS` lists them and `get_task(name)` finds one.
"""

from attn.app.tasks.registry import TASKS, evaluate, get_task, task_names
from attn.app.tasks.spec import EvalOptions, TaskSpec

__all__ = ["TASKS", "EvalOptions", "TaskSpec", "evaluate", "get_task", "task_names"]
