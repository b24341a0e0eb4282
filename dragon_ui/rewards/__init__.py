"""Reward functions: validate reward settings, build callables, and score completions without ever crashing training.

A reward scores one completion. Most built-in kinds return a value in [0, 1] (TRL's penalties and cosine_length go
below 0, a classifier's logit anywhere); ``custom`` may return any finite float. Every failure (an exception, a timeout, a value that is not a finite number) scores 0 for that completion and
is counted in :class:`RewardFailures`, so one bad row cannot stop a training run but a broken reward is still visible.

This package is light on purpose (no torch or gradio; trl.rewards only once one of TRL's kinds is built): the CLI, the
UI playground, evaluation and the TRL wrappers all score through :func:`score_completion` / :func:`safe_score`, and
they must agree exactly.
"""

from ..errors import RewardError
from .builtin import EPISODE_SCORE, Reward
from .scoring import (RewardFailures, ScoreResult, build_rewards, cannot_pay, counts_tokens, safe_score,
                      score_completion, score_completions, trl_reward_functions)
from .spec import (FORMAT_PRESETS, GOAL_KINDS, PENALTY_KINDS, REWARD_CLASSES, REWARD_KINDS, REWARD_SETTINGS, Choice,
                   Gate, RewardSpec, check_some_weight, gate_of, goal_names, kind_fields, parse_rewards, passes,
                   public_demo_refusal, public_refusal, reward_rule, right_by_goal, stored_metrics, training_weight)
from .text import EXTRACT_MODES, extract_answer

__all__ = ["Choice", "EPISODE_SCORE", "EXTRACT_MODES", "FORMAT_PRESETS", "GOAL_KINDS", "Gate", "PENALTY_KINDS",
           "REWARD_CLASSES", "REWARD_KINDS", "REWARD_SETTINGS", "Reward", "RewardError", "RewardFailures", "RewardSpec", "ScoreResult", "build_rewards", "cannot_pay",
           "check_some_weight", "counts_tokens", "extract_answer", "gate_of", "goal_names", "kind_fields",
           "parse_rewards", "passes", "public_demo_refusal", "public_refusal", "reward_rule", "right_by_goal",
           "safe_score", "score_completion", "score_completions", "stored_metrics", "trl_reward_functions",
           "training_weight"]
