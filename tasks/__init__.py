"""Tasks and task suites: the `Task` model, `TaskSuite` load/save, generators and split hygiene.

Imports nothing else of toolgym (the bottom layer, with `sandbox`).
"""

from toolgym.tasks import mined as _mined  # noqa: F401,E402 (registers the mined directory format with TaskSuite.load)
from toolgym.tasks.answers import answers_match, normalize_answer
from toolgym.tasks.dedup import LeakReport, find_leaks
from toolgym.tasks.generators import GeneratorError, SuiteSpec, builtin_suite, generate, register_suite, suite_specs
from toolgym.tasks.suite import HELDOUT, TRAIN, SplitLeakError, TaskLoadError, TaskSuite, task_from_dict
from toolgym.tasks.task import DifferentialCase, HiddenSpec, Probe, Task, TestRun, ToolCall

__all__ = [
    "HELDOUT",
    "TRAIN",
    "DifferentialCase",
    "GeneratorError",
    "HiddenSpec",
    "Probe",
    "LeakReport",
    "SplitLeakError",
    "SuiteSpec",
    "Task",
    "TaskLoadError",
    "TaskSuite",
    "TestRun",
    "ToolCall",
    "answers_match",
    "builtin_suite",
    "find_leaks",
    "generate",
    "normalize_answer",
    "register_suite",
    "suite_specs",
    "task_from_dict",
]
