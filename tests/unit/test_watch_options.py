"""A watched replay's options as forms and command lines give them, and its waves (pure logic)."""

from __future__ import annotations

import itertools

import pytest

from retry_scheduler.ops.watch import DEFAULT_VERDICT_S, Watch, WatchError, parse_share


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, None),
        ({"canary": "", "stop_above": None, "verdict_window": ""}, None),
        ({"canary": "0"}, None),
        ({"canary": "100"}, Watch(canary=100)),
        ({"canary": 7}, Watch(canary=7)),
        ({"canary": " 5% "}, Watch(canary_share=0.05)),
        ({"canary": "2.5%"}, Watch(canary_share=0.025)),
        ({"stop_above": "20%"}, Watch(stop_share=0.2)),
        ({"stop_above": "0.2"}, Watch(stop_share=0.2)),
        ({"stop_above": "20"}, Watch(stop_share=0.2)),
        ({"stop_above": "0%"}, Watch(stop_share=0.0)),
        (
            {"canary": "10", "verdict_window": "2m", "stop_above": "5%"},
            Watch(canary=10, verdict_s=120, stop_share=0.05),
        ),
        ({"canary": "10", "verdict_window": 45}, Watch(canary=10, verdict_s=45)),
    ],
)
def test_the_watch_a_form_asks_for(params: dict, expected: Watch | None) -> None:
    assert Watch.from_params(params) == expected


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"canary": "lots"}, "canary 'lots' must be a number of records or a share like '5%'"),
        ({"canary": "-3"}, "canary '-3' must be a number of records"),
        ({"canary": "0%"}, "canary '0%' must be more than 0%"),
        ({"canary": "150%"}, "must be at most 100%"),
        ({"canary": True}, "must be a number of records"),
        ({"canary": "1000000"}, "a canary of 1000000 records must be from 1 to 100,000"),
        ({"stop_above": "half"}, "stop share 'half' must be a share like '20%' or 0.2"),
        ({"stop_above": "nan"}, "stop share 'nan' must be a share"),
        ({"stop_above": "300%"}, "stop share '300%' must be at most 100%"),
        ({"verdict_window": "30s"}, "a verdict window needs a canary or a stop share"),
        ({"canary": "5", "verdict_window": "soon"}, "verdict window 'soon' must be a duration like '30s'"),
        ({"canary": "5", "verdict_window": "2d"}, "a verdict window of 172800.0 s must be from 0 to a day"),
    ],
)
def test_a_watch_that_cannot_be_used_says_what_to_give(params: dict, message: str) -> None:
    with pytest.raises(WatchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Watch.from_params(params)


def test_waves_are_the_canary_then_the_rest_in_order() -> None:
    ids = list(range(1, 26))
    assert Watch(canary=3, wave=10).waves(ids) == [ids[:3], ids[3:13], ids[13:23], ids[23:]]
    assert Watch(canary_share=0.1, wave=100).waves(ids) == [ids[:3], ids[3:]]  # 10 % of 25, rounded up
    assert Watch(stop_share=0.2, wave=10).waves(ids) == [ids[:10], ids[10:20], ids[20:]]
    assert Watch(canary=50).waves(ids) == [ids]  # a canary larger than the replay is the replay
    assert Watch(canary=3).waves([]) == []
    assert list(itertools.chain(*Watch(canary=7, wave=4).waves(ids))) == ids  # every id once, in order


def test_a_watch_needs_something_to_watch_for() -> None:
    with pytest.raises(WatchError, match="needs a canary or a stop share"):
        Watch()
    assert Watch(canary=1).verdict_s == DEFAULT_VERDICT_S
    assert parse_share("", "x") is None and parse_share("12.5%", "x") == 0.125


def test_a_watch_describes_itself() -> None:
    assert Watch(canary=100, stop_share=0.2, verdict_s=30).describe() == (
        "a canary of 100 records and a stop above 20% coming back, each wave watched 30 s after it was published"
    )
    assert Watch(canary_share=0.05).describe().startswith("a canary of 5% of the replay, each wave")
