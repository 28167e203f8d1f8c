"""docs/users/sizes.md: sizes as users write them, parsed into byte counts (whole MiB)."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from jupyter_gpushare.core.sizes import ACCEPTED_FORMS, Size, SizeError, format_bytes, parse_size, to_mib

MiB = 2**20
GiB = 2**30


@pytest.mark.parametrize(
    ("text", "expected_bytes"),
    [
        ("4G", 4 * GiB),
        ("4g", 4 * GiB),
        ("4GB", 4 * GiB),
        ("4gb", 4 * GiB),
        ("4GiB", 4 * GiB),
        ("4gib", 4 * GiB),
        ("0.5G", GiB // 2),
        ("1.25G", 5 * GiB // 4),
        (".5G", GiB // 2),
        ("512M", 512 * MiB),
        ("512m", 512 * MiB),
        ("512MB", 512 * MiB),
        ("512MiB", 512 * MiB),
        ("4096", 4096 * MiB),
        ("1", MiB),
        (" 8G ", 8 * GiB),
        ("\t8G\n", 8 * GiB),
        ("0.3G", 308 * MiB),  # 307.2 MiB, rounded up to whole MiB
        ("1.5M", 2 * MiB),
        (4096, 4096 * MiB),
        (1, MiB),
    ],
)
def test_byte_sizes_parse_to_exact_binary_bytes(text: object, expected_bytes: int) -> None:
    size = parse_size(text)
    assert size.form == "bytes"
    assert not size.is_whole
    # A byte size means the same on any device.
    assert size.resolve(16 * GiB) == expected_bytes
    assert size.resolve(80 * GiB) == expected_bytes


@pytest.mark.parametrize(
    ("text", "device_memory", "expected_bytes"),
    [
        ("25%", 80 * GiB, 20 * GiB),
        ("25%", 16 * GiB, 4 * GiB),
        ("100%", 40 * GiB, 40 * GiB),
        ("50%", 10 * GiB, 5 * GiB),
        ("12.5%", 8 * GiB, GiB),
        ("33%", 100 * MiB, (100 * MiB * 33) // 100),
    ],
)
def test_percent_is_a_share_of_the_device_it_lands_on(
    text: str, device_memory: int, expected_bytes: int
) -> None:
    size = parse_size(text)
    assert size.form == "percent"
    assert not size.is_whole
    assert size.resolve(device_memory) == expected_bytes


@pytest.mark.parametrize("text", ["whole", "WHOLE", "Whole", "  whole  "])
def test_whole_means_the_entire_device(text: str) -> None:
    size = parse_size(text)
    assert size.is_whole
    assert size.resolve(80 * GiB) == 80 * GiB
    assert size.resolve(16 * GiB) == 16 * GiB


@pytest.mark.parametrize("text", ["4G", "0.5G", "512MiB", "25%", "4096"])
def test_the_users_spelling_is_kept_for_messages(text: str) -> None:
    assert str(parse_size(text)) == text


@pytest.mark.parametrize(
    "value",
    [
        "abc",
        "10T",
        "10TB",
        "4X",
        "4 GB extra",
        "%",
        "",
        "  ",
        "1.5",
        "4G4",
        "G",
        "1e3",
        "whole card",
        # ASCII digits only, and no whitespace inside a size (issue 11)
        "٤G",
        "４G",
        "²G",
        "  4 G ",
        "4 G",
        "25 %",
        "\xa04G",
        "4\u2003G",
        True,
        False,
        None,
        4.0,
        0.5,
        ["4G"],
        {"size": "4G"},
    ],
)
def test_a_size_of_an_unknown_form_is_refused_with_the_accepted_forms(value: object) -> None:
    with pytest.raises(SizeError) as caught:
        parse_size(value)
    assert ACCEPTED_FORMS in str(caught.value)
    # It is also a ValueError, so generic validation code (traitlets, argparse) can catch it.
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1G", "GPU size '-1G' must be more than zero"),
        ("-1", "GPU size '-1' must be more than zero"),
        ("-25%", "GPU size '-25%' must be more than zero"),
        ("0", "GPU size '0' must be more than zero"),
        ("0G", "GPU size '0G' must be more than zero"),
        ("0M", "GPU size '0M' must be more than zero"),
        ("0.0G", "GPU size '0.0G' must be more than zero"),
        ("0%", "GPU share '0%' must be from 0.01% to 100%"),
        ("101%", "GPU share '101%' must be from 0.01% to 100%"),
        ("100.5%", "GPU share '100.5%' must be from 0.01% to 100%"),
        (0, "GPU size 0 must be more than zero"),
        (-1, "GPU size -1 must be more than zero"),
        (-4096, "GPU size -4096 must be more than zero"),
    ],
)
def test_a_size_of_a_good_form_out_of_range_says_the_range_alone(value: object, message: str) -> None:
    """Issue 25: the list of forms is no help when the form was fine."""
    with pytest.raises(SizeError) as caught:
        parse_size(value)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("size_bytes", "expected"),
    [
        (80 * GiB, "80G"),
        (4 * GiB, "4G"),
        (GiB, "1G"),
        (15 * GiB // 2, "7.5G"),
        (512 * MiB, "512M"),
        (MiB, "1M"),
        (3 * MiB // 2, "1.5M"),
    ],
)
def test_format_bytes_in_the_units_users_type(size_bytes: int, expected: str) -> None:
    assert format_bytes(size_bytes) == expected


@pytest.mark.parametrize(
    ("size_bytes", "expected"), [(MiB, 1), (MiB + 1, 2), (2 * MiB - 1, 2), (4 * GiB, 4096), (1, 1)]
)
def test_to_mib_rounds_up_so_a_cap_never_undercuts_the_reservation(size_bytes: int, expected: int) -> None:
    assert to_mib(size_bytes) == expected


@pytest.mark.parametrize("text", ["4G", "0.5G", "512M", "4096", "7.5G", "80G"])
def test_format_bytes_round_trips_through_parse_size(text: str) -> None:
    size_bytes = parse_size(text).resolve(0)
    assert parse_size(format_bytes(size_bytes)).resolve(0) == size_bytes


@given(st.integers(min_value=1, max_value=10**7))
def test_megabytes_and_bare_integers_agree(n: int) -> None:
    assert parse_size(f"{n}M").resolve(0) == n * MiB
    assert parse_size(f"{n}MiB").resolve(0) == n * MiB
    assert parse_size(str(n)).resolve(0) == n * MiB
    assert parse_size(n).resolve(0) == n * MiB


@given(st.integers(min_value=1, max_value=10**5))
def test_gigabytes_are_1024_megabytes(n: int) -> None:
    assert parse_size(f"{n}G").resolve(0) == parse_size(f"{n * 1024}M").resolve(0) == n * GiB


# Size-like text: digits, separators, units and signs in any order, so that the property below
# reaches the branches of the parser that random unicode rarely does.
SIZE_LIKE = st.from_regex(r"\A[ ]?[-+]?[0-9]{0,14}(\.[0-9]{0,14})?[ ]?(G|g|GB|GiB|M|MB|MiB|T|%|whole|x)?\Z")


@given(st.one_of(st.text(), SIZE_LIKE))
@example("0.000000000001%")  # a share so small it is zero bytes on an 80 GiB card
@example("0.0000000001G")
def test_any_text_is_a_positive_size_or_a_size_error(text: str) -> None:
    try:
        size = parse_size(text)
    except SizeError as error:
        assert ACCEPTED_FORMS in str(error) or "must be" in str(error)
        return
    assert isinstance(size, Size)
    assert size.resolve(80 * GiB) > 0


@pytest.mark.parametrize(
    ("texts", "canonical"),
    [
        (["4G", "4g", "4GB", "4GiB", "4096", " 4G ", "4096M", "4096MiB"], "4G"),
        (["0.5G", "512M", "512", ".5g"], "512M"),
        (["1536M", "1.5G"], "1536M"),
        (["0.3G"], "308M"),
        (["25%", "25.0%", "25.00%"], "25%"),
        ([".5%", "0.50%"], "0.5%"),
        (["whole", "WHOLE", " Whole "], "whole"),
    ],
)
def test_every_spelling_of_a_size_has_one_canonical_form(texts: list[str], canonical: str) -> None:
    for text in texts:
        assert parse_size(text).canonical == canonical, text
    assert parse_size(canonical).canonical == canonical


def test_digits_other_than_ascii_are_named_in_the_message() -> None:
    with pytest.raises(SizeError, match="has a digit that is not 0-9"):
        parse_size("٤G")
    with pytest.raises(SizeError, match="space inside"):
        parse_size("  4 G ")


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(["G", "M", "%", ""]))
def test_the_canonical_form_means_the_same_size(n: int, unit: str) -> None:
    text = f"{n}{unit}" if unit != "%" else f"{n % 100 + 1}%"
    size = parse_size(text)
    again = parse_size(size.canonical)
    assert (again.form, again.amount) == (size.form, size.amount)
