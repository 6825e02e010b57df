"""A watched replay: a canary slice first, then the rest in waves, each watched for the records that
come back before the next goes, stopping by itself when too many do.

A replay into a consumer that is still broken fails every letter again. Watched, it sends its first
wave (the **canary**: N records, or a share of the replay), waits until the publish loop has sent
all of them, then waits the **verdict window** and counts the records of the wave that *came back*:
stored again since the wave went out under the same ``retry.id`` (the application failed the record
again and handed it to a retry topic, or sent it to the dead letters; both pass through the retry
topics). The replay goes on only if none of the canary's came back. The rest goes in waves of
:data:`WAVE` records, each watched the same way; when more than ``stop_share`` of the records
published so far came back, the replay **stops**, says why, and leaves the rest dead and untouched.

Where it stops, nothing is lost: every record it has not sent is still dead, as before the replay;
those of the waves it sent are pending or published, as in any replay. Killed at any moment (kill -9
included), it has made due only the waves its transactions committed; a second replay of the same
filter takes the rest. A wave the publish loop does not send in time (the ``retry_scheduler`` DAG
paused, say) stops the replay too: its records stay pending and go when the loop runs again.

What counts as "came back" is the records a deployment's retry topics see again: an application that
writes its failures to a dead-letter topic of its own (a Spring ``DeadLetterPublishingRecoverer``
adopted here) is seen only if that topic is adopted, and then as a new letter.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from retry_scheduler.core.durations import parse_duration_ms
from retry_scheduler.db.selection import SelectionError

if TYPE_CHECKING:
    from retry_scheduler.db.dead_letters import DeadLetters

log = logging.getLogger(__name__)

#: Records per wave after the canary.
WAVE = 10_000
#: The verdict window when none is given: how long after a wave's last record was published the
#: replay waits for records of it to come back.
DEFAULT_VERDICT_S = 30.0
#: How long a wave may take to be published after its last record fell due before the replay stops.
PUBLISH_TIMEOUT_S = 300.0
#: The most records a canary may be (the first wave is at most a batch of ids).
MAX_CANARY = 100_000
#: How often the replay looks at a wave's progress.
POLL_S = 0.5


class WatchError(SelectionError):
    """A canary, verdict window or stop share that cannot be used; the message says what to give."""


def parse_share(value: object, what: str) -> float | None:
    """A share from ``"20%"``, ``20`` (percent, above 1), ``0.2`` or nothing (None or empty: None)."""
    if value is None or value == "":
        return None
    text = str(value).strip()
    percent = text.endswith("%")
    try:
        number = float(text.rstrip("%").strip())
    except ValueError:
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number < 0:
        raise WatchError(f"{what} {text[:40]!r} must be a share like '20%' or 0.2")
    share = number / 100 if percent or number > 1 else number
    if share > 1:
        raise WatchError(f"{what} {text[:40]!r} must be at most 100%")
    return share


@dataclass(frozen=True)
class Watch:
    """How a replay is watched. ``canary``: the first wave's size in records (0: a share of the
    replay, ``canary_share``); ``verdict_s``: how long after a wave's last record was published the
    replay waits for records of it to come back; ``stop_share``: the share of published records that
    came back past which the replay stops (None: only the canary can stop it); ``wave``: the size of
    the waves after the canary."""

    canary: int = 0
    canary_share: float = 0.0
    verdict_s: float = DEFAULT_VERDICT_S
    stop_share: float | None = None
    wave: int = WAVE
    publish_timeout_s: float = PUBLISH_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 0 <= self.canary <= MAX_CANARY:
            raise WatchError(f"a canary of {self.canary} records must be from 1 to {MAX_CANARY:,}")
        if not 0 <= self.canary_share <= 1:
            raise WatchError(f"a canary share of {self.canary_share} must be from 0 to 100%")
        if not (self.canary or self.canary_share or self.stop_share is not None):
            raise WatchError("a watched replay needs a canary or a stop share (or both)")
        if not 0 <= self.verdict_s <= 86_400:
            raise WatchError(f"a verdict window of {self.verdict_s} s must be from 0 to a day")
        if not 1 <= self.wave <= WAVE * 10:
            raise WatchError(f"waves of {self.wave} records must be from 1 to {WAVE * 10:,}")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Watch | None:
        """The watch a form, the page or a command line asks for: ``canary`` (``"100"`` records or
        ``"5%"`` of the replay), ``verdict_window`` (a duration, ``"30s"``; numbers are seconds) and
        ``stop_above`` (a share, ``"20%"``). None when neither a canary nor a stop share is given."""
        canary, canary_share = 0, 0.0
        raw = params.get("canary")
        if raw not in (None, "", 0, "0"):
            text = str(raw).strip()
            if text.endswith("%"):
                canary_share = parse_share(text, "canary") or 0.0
                if not canary_share:
                    raise WatchError(f"canary {text!r} must be more than 0%")
            elif text.isdigit() and not isinstance(raw, bool):
                canary = int(text)
            else:
                raise WatchError(f"canary {text[:40]!r} must be a number of records or a share like '5%'")
        stop_share = parse_share(params.get("stop_above"), "stop share")
        if not canary and not canary_share and stop_share is None:
            if params.get("verdict_window") not in (None, ""):
                raise WatchError("a verdict window needs a canary or a stop share to watch the replay")
            return None
        verdict = params.get("verdict_window")
        try:
            verdict_s = DEFAULT_VERDICT_S if verdict in (None, "") else parse_duration_ms(verdict) / 1000
        except (ValueError, TypeError):
            raise WatchError(
                f"verdict window {str(verdict)[:40]!r} must be a duration like '30s' or '2m'"
            ) from None
        return cls(canary=canary, canary_share=canary_share, verdict_s=verdict_s, stop_share=stop_share)

    def waves(self, ids: Sequence[int]) -> list[Sequence[int]]:
        """``ids`` (oldest first) as waves: the canary first (when asked for), then the rest."""
        first = self.canary or (math.ceil(len(ids) * self.canary_share) if self.canary_share else 0)
        first = min(first, len(ids))
        waves: list[Sequence[int]] = [ids[:first]] if first else []
        waves += [ids[i : i + self.wave] for i in range(first, len(ids), self.wave)]
        return waves

    def has_canary(self) -> bool:
        return bool(self.canary or self.canary_share)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "publish_timeout_s"}

    def describe(self) -> str:
        canary = f"{self.canary:,} records" if self.canary else f"{self.canary_share:.0%} of the replay"
        parts = [f"a canary of {canary}"] if self.has_canary() else []
        if self.stop_share is not None:
            parts.append(f"a stop above {self.stop_share:.0%} coming back")
        return " and ".join(parts) + f", each wave watched {self.verdict_s:g} s after it was published"


@dataclass
class WaveVerdict:
    """What became of one wave: its records published, those that came back within the window, and
    why the replay stops after it (None: it goes on)."""

    published: int
    came_back: int
    stopped: str | None = None


def watch_wave(
    letters: DeadLetters,
    watch: Watch,
    *,
    ids: Sequence[int],
    retry_ids: Sequence[str],
    since: int,
    canary: bool,
    published_before: int,
    came_back_before: int,
    remaining: int,
    sleep: Callable[[float], None] = time.sleep,
) -> WaveVerdict:
    """Wait until the wave ``ids`` is published, then ``watch.verdict_s``; count its records that came
    back (stored after ``since`` under one of ``retry_ids``) and decide whether the replay goes on
    (``remaining``: records not yet sent, for the message)."""
    while True:
        with letters.transaction():
            pending, published, last_published, last_due, now = letters.wave(ids)
        if not pending:
            break
        if isinstance(last_due, datetime) and (now - last_due).total_seconds() > watch.publish_timeout_s:
            return WaveVerdict(
                published,
                0,
                f"{pending:,} records of a wave were not published {watch.publish_timeout_s:g} s after they "
                "fell due (is the retry_scheduler DAG running? is their destination's breaker open: "
                "`retry-scheduler breakers list`?): they stay pending and go when it runs; "
                f"{remaining:,} not sent, left dead",
            )
        sleep(POLL_S)
    if isinstance(last_published, datetime):
        sleep(max(0.0, watch.verdict_s - (now - last_published).total_seconds()))
    with letters.transaction():
        came_back = letters.came_back(since, retry_ids)
    verdict = WaveVerdict(published, came_back)
    log.info(
        "watched replay: %d of the wave's %d published records came back within %g s",
        came_back, published, watch.verdict_s,
    )  # fmt: skip
    total_published, total_back = published_before + published, came_back_before + came_back
    if canary and came_back:
        verdict.stopped = (
            f"the canary failed: {came_back:,} of its {published:,} records came back within "
            f"{watch.verdict_s:g} s; {remaining:,} not sent, left dead"
        )
    elif watch.stop_share is not None and total_published and total_back / total_published > watch.stop_share:
        verdict.stopped = (
            f"{total_back:,} of {total_published:,} published records came back ({total_back / total_published:.0%}, "
            f"more than {watch.stop_share:.0%}); {remaining:,} not sent, left dead"
        )
    return verdict
