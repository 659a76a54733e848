import pytest

from synapse.core.jobs.quantity import QuantityError, format_cpu, format_memory, parse_cpu, parse_duration, parse_memory


@pytest.mark.parametrize("text,expected", [
    ("64Mi", 64 << 20), ("1Gi", 1 << 30), ("512M", 512_000_000), ("1024", 1024), (2048, 2048),
    ("1.5Gi", 3 << 29), ("2G", 2_000_000_000), ("10Ki", 10240), ("4GiB", 4 << 30),
])
def test_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["", "lots", "-1Gi", "1Xi", True, -5, "1 Gi Gi"])
def test_memory_rejects(bad):
    with pytest.raises(QuantityError):
        parse_memory(bad)


@pytest.mark.parametrize("text,expected", [(16, 16000), ("0.5", 500), ("500m", 500), ("2", 2000)])
def test_cpu(text, expected):
    assert parse_cpu(text) == expected


@pytest.mark.parametrize("text,expected", [("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("45s", 45),
                                           ("1d", 86400), (30, 30), ("120", 120)])
def test_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["soon", "2x", "h", "-3", "2h soon"])
def test_duration_rejects(bad):
    with pytest.raises(QuantityError):
        parse_duration(bad)


def test_formats_round_trip():
    assert format_memory(64 << 30) == "64Gi" and format_memory(1000) == "1000"
    assert format_cpu(16000) == "16" and format_cpu(500) == "500m"
    assert parse_memory(format_memory(3 << 29)) == 3 << 29
