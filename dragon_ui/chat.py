"""Chat messages as text: what a conversational prompt asked and what a completion answered.

TRL hands prompts and completions as lists of messages (or plain strings); the rewards, the dataset's rendering and
the run's records read the text of one message from them.
"""

from __future__ import annotations

import json
from typing import Any

Chat = list[dict[str, Any]]  # messages as TRL and chat templates take them: role, content, tool calls


def _message_text(content: object) -> str:
    """Message content as text: a plain string, or the text parts of a multimodal content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def last_user_text(prompt: str | Chat | None) -> str:
    """The last user message of a conversational prompt (what the reward calls "the prompt"), or a plain string."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(prompt or []):
        if message.get("role") == "user":
            return _message_text(message.get("content"))
    return ""


def completion_text(completion: str | Chat | None) -> str:
    """The last assistant message's text of a conversational completion, or a plain string."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion or []):
        if message.get("role", "assistant") == "assistant":
            return _message_text(message.get("content"))
    return ""


def call_text(name: object, arguments: object) -> str:
    """A tool call as one reads it: name(argument="value", ...)."""
    shown = ", ".join(f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in arguments.items()) \
        if isinstance(arguments, dict) else json.dumps(arguments, ensure_ascii=False, default=str)
    return f"{name}({shown})"


def turns_text(messages: Chat) -> str:
    """A reply that called tools as plain text, one line a turn: its text and calls, each tool's answer after an
    arrow, and the final answer."""
    lines = []
    for message in messages:
        content = _message_text(message.get("content"))
        if message.get("role") == "tool":
            lines.append(f"→ {message.get('name')} answered: {content}")
            continue
        if content:
            lines.append(content)
        lines += [call_text((call.get("function") or {}).get("name"), (call.get("function") or {}).get("arguments"))
                  for call in message.get("tool_calls") or [] if isinstance(call, dict)]
    return "\n".join(lines)
