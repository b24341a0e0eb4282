"""Tools a model may call while it answers (multi-turn GRPO): the settings, the built-in tools, and the functions
TRL's GRPOTrainer is handed (``tools=``), each bounded in what it may return and stopped with the run.

Like ``rewards``, this package is light (no torch or gradio): the config, the engine, the CLI and the studio all
build a run's tools through ``building.build_tools``, so every entry point calls the same functions the same way.
"""

from __future__ import annotations

from .bounds import ANSWER_CHARS
from .building import build_environments, build_tools, demonstration, described, tool_schema, with_demonstration
from .builtin import ToolError
from .environments import Played, environment_tools
from .spec import (DEFAULT_NAMES, ENVIRONMENT_KINDS, MOST_EXAMPLES, MOST_TOOLS, TOOL_CLASSES, TOOL_KINDS, TOOL_SETTINGS,
                   ToolExample, ToolSpec, form_settings, parse_tools, public_refusal)

__all__ = ["ANSWER_CHARS", "DEFAULT_NAMES", "ENVIRONMENT_KINDS", "MOST_EXAMPLES", "MOST_TOOLS", "TOOL_CLASSES",
           "TOOL_KINDS", "TOOL_SETTINGS", "Played", "ToolError", "ToolExample", "ToolSpec", "build_environments", "build_tools", "demonstration",
           "described", "environment_tools", "form_settings", "parse_tools", "public_refusal", "tool_schema",
           "with_demonstration"]
