"""Evaluation: pinned protocols (``protocol``), named suites (``suites``) and reports (``report``).

``evaluate(policy, env_cfg, episodes, seed, num_envs, ...)`` evaluates one task (used by the
training runner); ``evaluate_suite(policy, "libero_spatial", ...)`` a whole suite.
"""

from vlarl.evaluation.protocol import (
    TaskPlan,
    evaluate,
    evaluate_tasks,
    plan_task,
    run_episodes,
    run_plan,
    summarize,
)
from vlarl.evaluation.report import compare, compare_table, fisher_exact_p, load_result, newcombe_interval
from vlarl.evaluation.suites import (
    Suite,
    SuiteError,
    TaskEntry,
    available_suites,
    build_env_config,
    evaluate_suite,
    get_suite,
    register_suite,
    register_task_lister,
    suite_tasks,
)
from vlarl.evaluation.video import record_video

__all__ = [
    "Suite", "SuiteError", "TaskEntry", "TaskPlan", "available_suites", "build_env_config", "compare", "compare_table",
    "evaluate", "evaluate_suite", "evaluate_tasks", "fisher_exact_p", "get_suite", "load_result",
    "newcombe_interval", "plan_task", "record_video", "register_suite", "register_task_lister", "run_episodes", "run_plan",
    "suite_tasks", "summarize",
]
