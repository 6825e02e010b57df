"""How the Dead letters page, the CLI and the API show keys, values and headers."""

from __future__ import annotations

from retry_scheduler.ops.browse import render_bytes


def test_utf8_text_is_shown_as_text() -> None:
    assert render_bytes("naïve {\"a\": 1}\n".encode()) == {
        "encoding": "utf-8", "text": "naïve {\"a\": 1}\n", "size": 16, "truncated": False,
    }  # fmt: skip


def test_binary_and_control_characters_are_shown_as_hex() -> None:
    assert render_bytes(b"\xff\xfe")["encoding"] == "hex"  # type: ignore[index]
    assert render_bytes(b"ab\x00c") == {
        "encoding": "hex",
        "text": "61 62 00 63",
        "size": 4,
        "truncated": False,
    }


def test_long_values_are_cut_and_say_so() -> None:
    shown = render_bytes(b"x" * 10, limit=4)
    assert shown == {"encoding": "utf-8", "text": "xxxx", "size": 10, "truncated": True}


def test_a_character_cut_in_half_by_the_limit_is_still_text() -> None:
    shown = render_bytes("aé€".encode() * 3, limit=5)  # a(1) é(2) €(3): the € is cut
    assert shown == {"encoding": "utf-8", "text": "aé", "size": 18, "truncated": True}


def test_null_and_empty_are_different() -> None:
    assert render_bytes(None) is None
    assert render_bytes(b"") == {"encoding": "utf-8", "text": "", "size": 0, "truncated": False}
