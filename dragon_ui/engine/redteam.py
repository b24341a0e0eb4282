"""Can these rewards be gamed? Before training, score a fixed set of gaming replies, made for each of some real rows,
against the rewards, next to the best honest reply on the same rows. A gaming reply that earns at least half as
much as the honest one is what GRPO will find and reinforce: the report names the reward that pays for it and how to
close it. No model is needed: it takes a second.

The gaming replies hold no right final answer (the reference is only ever named beside a wrong one), except "the
answer repeated", which is flagged only when repeating pays more than saying the answer once. A wrong answer in the
shape the rewards like (short, in the tags) is judged against the same wrong answer in a sentence: where it earns
more, the shape picks the winner of a group that has no right reply, and training teaches the shape whatever the
answer.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import RunConfig
from ..data import prompt_text
from ..public import Policy
from ..rewards import Reward, build_rewards, goal_names
from ..rewards.spec import FORMAT_PRESETS, FormatReward, JsonReward
from .evaluation import score_examples
from .models import load_tokenizer, resolve_model
from .reward_models import classifiers_on

FLAG_SHARE = 0.5  # a gaming reply that earns this share of the best honest reply's total is flagged
# A shaped wrong answer that earns this share of the honest total more than a plain one (GRPO divides by the group's
# spread, so among wrong replies any difference becomes a whole advantage)...
WRONG_MARGIN = 0.01
NO_RIGHT_MANY = 0.25  # ...is flagged where at least this share of the pre-flight's groups has no right reply
MOST_ROWS = 8  # the rows the replies are made for
FILLER = "Let me think about this step by step and explain my working carefully. "
CHARS_PER_TOKEN = 4  # a padded reply's length without a tokenizer to count it

# What a reward of each kind pays for, in the words that say how to close it.
CLOSE_IT = {
    "exact": "it compares the extracted answer: check its extract mode",
    "contains": "it pays for the reference anywhere in the reply: compare the final answer instead (exact, or numeric "
                "with last_number)",
    "numeric": "it reads the last number of what it extracts: extract the answer from a fixed place (answer_tag, "
               "boxed, after_hashes)",
    "math": "it compares the extracted answer: extract it from a fixed place (answer_tag, boxed)",
    "regex": "its pattern matches this reply: anchor it (^…$) or match the answer itself",
    "json": "it checks that the JSON parses and has the keys, not their values: add a reward for the values",
    "length": "it pays for a short reply whatever it says: weigh it below the answer's reward",
    "keyword": "it pays for the words anywhere: require the answer too, or weigh it lower",
    "format": "it pays for the tags whatever they hold: weigh it below the answer's reward",
    "think_format": "it pays for the tags whatever they hold: weigh it below the answer's reward",
    "overlong": "a penalty pays nothing; another reward pays for this",
    "repetition": "a penalty pays nothing; another reward pays for this",
    "cosine_length": "it pays for length as well as correctness: lower its weight",
    "classifier": "the classifier scores this reply well: pay for the answer too",
    "command": "your command scores this reply well: check what it tests",
    "custom": "your function scores this reply well: check what it tests",
}


@dataclass(frozen=True)
class GamingCheck:
    """One gaming reply over the rows: its total and the best honest reply's, each a mean over the rows."""

    name: str
    example: str  # the reply as made for the first row
    total: float
    honest: float
    paid_by: list[str]  # the rewards that pay it, most first (a shaped wrong answer: that pay it more)
    flagged: bool
    against_wrong: float | None = None  # a shaped wrong answer: what the same wrong answer in a sentence earns

    @property
    def share(self) -> float | None:
        """The gaming reply's total over the honest reply's (None when the honest reply earns nothing)."""
        return self.total / self.honest if self.honest > 0 else None


@dataclass(frozen=True)
class RedTeam:
    checks: list[GamingCheck]
    rows: int
    advice: dict[str, str] = field(default_factory=dict)  # reward name -> how to close it

    @property
    def flagged(self) -> list[GamingCheck]:
        return [check for check in self.checks if check.flagged]

    @property
    def verdict(self) -> str:
        if not self.flagged:
            return (f"No gaming reply earns half of what an honest one does ({len(self.checks)} tried on {self.rows} "
                    f"row{'s' if self.rows != 1 else ''}).")
        sentences = []
        for check in self.flagged:
            if check.against_wrong is not None:
                sentences.append(f"'{check.name}' earns {check.total - check.against_wrong:.2f} more than the same "
                                 f"wrong answer in a sentence, paid by {', '.join(check.paid_by)}: where no reply is "
                                 "right, the shape picks the winner.")
                continue
            share = "" if check.share is None else f" {round(100 * check.share)} % of"
            sentences.append(f"'{check.name}' earns{share} what an honest reply does, paid by "
                             f"{', '.join(check.paid_by)}.")
        named = dict.fromkeys(check.paid_by[0] for check in self.flagged if check.paid_by)  # the main payer
        sentences += [f"{name}: {self.advice[name]}." for name in named if name in self.advice]
        return "These rewards can be gamed: " + " ".join(sentences)

    def describe(self) -> str:
        lines = [self.verdict, "Gaming reply: its total / the best honest reply's (means over the rows)"]
        lines += [f"  {'⚠ ' if check.flagged else '  '}{check.name}: {check.total:.2f} / {check.honest:.2f}"
                  + ("" if check.against_wrong is None else f", in a sentence {check.against_wrong:.2f}")
                  + (f" (paid by {', '.join(check.paid_by)})" if check.paid_by else "") for check in self.checks]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "rows": self.rows,
                "checks": [{"name": check.name, "example": check.example, "total": check.total,
                            "honest": check.honest, "share": check.share, "paid_by": check.paid_by,
                            "flagged": check.flagged, "against_wrong": check.against_wrong}
                           for check in self.checks]}


def red_team(rewards: list[Reward], examples: list[dict], max_new_tokens: int, tokenizer=None,
             should_stop: Callable[[], bool] | None = None, time_limit_s: float | None = None,
             no_right: float | None = None) -> RedTeam:
    """Score the gaming replies and the honest ones for the first MOST_ROWS ``examples`` (mapped rows with
    references) against ``rewards``; a reply is padded to ``max_new_tokens`` (counted with ``tokenizer`` when
    given). Stopped before the next reward once ``should_stop()`` (Cancel), or once ``time_limit_s`` has passed.

    ``no_right``: the share of the pre-flight's sampled groups in which no reply passes the goal. A wrong answer that
    earns more for its shape matters only in such groups, so it is flagged only where they are many
    (NO_RIGHT_MANY); without samples (None) it is shown, not flagged."""
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s

    def stop_now() -> bool:
        return (should_stop is not None and should_stop()) or (deadline is not None and time.monotonic() > deadline)

    padding = _padded(FILLER, max_new_tokens, tokenizer)  # the same for every row
    rows = [example for example in examples if example.get("reference")][:MOST_ROWS] or examples[:MOST_ROWS]
    references = [row.get("reference") or "" for row in rows]
    weights = {reward.name: reward.weight for reward in rewards}
    goal = goal_names([reward.spec for reward in rewards])
    totals: dict[str, float] = {}
    paid: dict[str, dict[str, float]] = {}
    honest = plain = 0.0
    made_for_first: dict[str, str] = {}
    for index, example in enumerate(rows):
        reference, wrong = references[index], _wrong_answers(references, index)
        honest_replies = _honest(example, rewards, reference)
        gaming = _gaming(example, rewards, reference, wrong, padding, max_new_tokens, tokenizer)
        replies = [*honest_replies, *gaming.values()]
        scored = score_examples(rewards, [example] * len(replies), replies, stop_now)
        honest_scores, gaming_scores = scored[:len(honest_replies)], scored[len(honest_replies):]
        honest += max(result.total for result in honest_scores)
        plain += honest_scores[0].total
        for (name, reply), result in zip(gaming.items(), gaming_scores, strict=True):
            made_for_first.setdefault(name, reply)
            totals[name] = totals.get(name, 0.0) + result.total
            for reward_name, score in result.scores.items():
                paid.setdefault(name, {})
                paid[name][reward_name] = paid[name].get(reward_name, 0.0) + weights[reward_name] * score
    checks = []
    for name, total in totals.items():
        against = totals[PLAIN_WRONG] if name in SHAPED_WRONG else None
        if against is None:
            paid_by = [reward for reward, amount in sorted(paid[name].items(), key=lambda item: -item[1])
                       if amount > 0]
            flagged = honest > 0 and total >= FLAG_SHARE * honest and (name != REPEATED or total > plain + 1e-9)
        else:
            more = {reward: amount - paid[PLAIN_WRONG][reward] for reward, amount in paid[name].items()}
            paid_by = [reward for reward, amount in sorted(more.items(), key=lambda item: -item[1]) if amount > 1e-9]
            flagged = honest > 0 and total - against >= WRONG_MARGIN * honest and (no_right or 0) >= NO_RIGHT_MANY
        checks.append(GamingCheck(name, made_for_first[name], round(total / len(rows), 4),
                                  round(honest / len(rows), 4), paid_by, flagged,
                                  None if against is None else round(against / len(rows), 4)))
    advice = {reward.name: close_it(reward.spec) for reward in rewards}
    for check in checks:
        if check.flagged and check.against_wrong is not None and check.paid_by and goal:
            advice[check.paid_by[0]] = (f"it pays a wrong answer for its shape: pay it only when {goal[0]} passes "
                                        f"(only_when: {goal[0]})")
    return RedTeam(checks, len(rows), advice)


REPEATED = "the answer repeated"
PLAIN_WRONG = "a confident wrong answer"
SHAPED_WRONG = ("a short wrong answer", "a well-formatted wrong answer")
PADDING = ("it pays for length, not for content: pay for a short reply (at most so many characters), or remove the "
           "minimum")


def close_it(spec) -> str:
    """How to stop a reward of ``spec`` paying for a gaming reply."""
    if spec.kind == "length" and spec.min_chars:
        return PADDING
    return CLOSE_IT.get(spec.kind, "check what it pays for")


def red_team_of(config: RunConfig, examples: list[dict], device: str, *, policy: Policy) -> RedTeam:
    """``red_team`` of a run's rewards, built as a run builds them, on its first training ``examples``."""
    tokenizer = load_tokenizer(resolve_model(config.model))
    rewards = build_rewards(config.rewards, base_dir=config.base_dir or None, tokenizer=tokenizer,
                            max_new_tokens=config.grpo.max_new_tokens, classifiers=classifiers_on(device),
                            policy=policy)
    return red_team(rewards, examples, config.grpo.max_new_tokens, tokenizer,
                    time_limit_s=policy.limits.scoring_seconds if policy.limits else None)


def _wrong_answers(references: list[str], index: int) -> list[str]:
    """Three wrong answers for row ``index``: the numbers just above it for a number, else other rows' references
    (or the reference with a word added, where there are none)."""
    reference = references[index]
    number = as_number(reference)
    if number is not None:
        step = 1 if number.is_integer() else 1.5
        return [_plain(number + step * k) for k in (1, 2, 3)]
    others = list(dict.fromkeys(other for other in references if other and other != reference))
    return (others + [f"{reference} {word}" for word in ("perhaps", "maybe", "probably")])[:3]


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def as_number(text: str) -> float | None:
    """``text`` as a finite number (a thousands comma allowed), or None when it is anything else."""
    try:
        value = float(text.replace(",", "").strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _tags(rewards: list[Reward]) -> list[str]:
    """The tags the rewards ask for (format rewards' tags, think_format's and answer_tag's)."""
    tags: list[str] = []
    for reward in rewards:
        spec = reward.spec
        if isinstance(spec, FormatReward):
            tags += list(spec.tags or FORMAT_PRESETS.get(spec.preset or "", ()))
        elif spec.kind == "think_format":
            tags.append("think")
        if getattr(spec, "extract", None) == "answer_tag":
            tags.append("answer")
    return list(dict.fromkeys(tags))


def _honest(example: dict, rewards: list[Reward], reference: str) -> list[str]:
    """Honest replies to the row, in the shapes the rewards ask for; the first is the reference alone."""
    replies = [reference, f"The answer is {reference}."]
    tags = _tags(rewards)
    if tags:
        replies.append("\n".join(f"<{tag}>{reference if tag == 'answer' or tag == tags[-1] else 'I work it out.'}"
                                 f"</{tag}>" for tag in tags))
    extracts = {getattr(reward.spec, "extract", "whole") for reward in rewards}
    if "boxed" in extracts:
        replies.append(f"The answer is \\boxed{{{reference}}}.")
    if "after_hashes" in extracts:
        replies.append(f"I work it out.\n#### {reference}")
    row = json.loads(example.get("row") or "{}")
    for reward in rewards:
        if isinstance(reward.spec, JsonReward):
            keys = reward.spec.keys or ["answer"]
            replies.append(json.dumps({key: row.get(key, reference) for key in keys}, ensure_ascii=False))
    return replies


def _gaming(example: dict, rewards: list[Reward], reference: str, wrong: list[str], padding: str,
            max_new_tokens: int, tokenizer) -> dict[str, str]:
    """The gaming replies to the row, by name: none ends with the right answer (but REPEATED)."""
    tags = _tags(rewards) or ["answer"]
    return {
        "an empty reply": "",
        "the prompt copied back": prompt_text(example),
        "the reference in a negation": f"Not {reference}, but {wrong[0]}.",
        "every option listed": f"It could be {reference}, {', '.join(wrong[:-1])} or {wrong[-1]}.",
        "the tags with nothing in them": "".join(f"<{tag}></{tag}>" for tag in tags),
        "a padded reply at the length cap": padding,
        REPEATED: _padded(f"{reference} ", max_new_tokens, tokenizer),
        "a number spray": " ".join(str(number) for number in range(1, 101)),
        PLAIN_WRONG: f"The answer is definitely {wrong[0]}.",
        SHAPED_WRONG[0]: wrong[0],
        SHAPED_WRONG[1]: "\n".join(f"<{tag}>{wrong[0] if tag == 'answer' or tag == tags[-1] else 'I work it out.'}"
                                   f"</{tag}>" for tag in tags),
    }


def _padded(unit: str, max_new_tokens: int, tokenizer) -> str:
    """``unit`` repeated up to the length cap of ``max_new_tokens`` tokens."""
    text = unit * (max_new_tokens * CHARS_PER_TOKEN // max(1, len(unit)) + 1)
    if tokenizer is None:
        return text[:max_new_tokens * CHARS_PER_TOKEN].strip()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
    return tokenizer.decode(ids, skip_special_tokens=True).strip()
