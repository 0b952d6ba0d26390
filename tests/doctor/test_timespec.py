import pytest

from prefixgate.doctor import parse_time


def test_date_is_utc_midnight():
    assert parse_time("2026-08-13") == 1786579200.0


def test_iso_time_with_zone():
    assert parse_time("2026-08-13T08:00:00+08:00") == 1786579200.0
    assert parse_time("2026-08-13T00:00:00Z") == 1786579200.0


def test_relative_ages():
    now = 1_800_000_000.0
    assert parse_time("24h", now=now) == now - 86400
    assert parse_time("7d", now=now) == now - 7 * 86400
    assert parse_time("30m", now=now) == now - 1800
    assert parse_time("2w", now=now) == now - 14 * 86400


def test_epoch_seconds():
    assert parse_time("1786579200") == 1786579200.0
    assert parse_time("1786579200.5") == 1786579200.5
    assert parse_time(1786579200) == 1786579200.0


@pytest.mark.parametrize("bad", ["", "yesterday", "12x", "2026-13-45"])
def test_rejects_garbage(bad):
    with pytest.raises(ValueError):
        parse_time(bad)
