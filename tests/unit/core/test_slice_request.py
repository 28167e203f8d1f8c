"""Checking the three request fields a kernelspec, a REST body or a magic carries."""

from __future__ import annotations

import pytest

from jupyter_gpushare.core.errors import InvalidRequestError
from jupyter_gpushare.core.modes import MODES
from jupyter_gpushare.core.sizes import ACCEPTED_FORMS
from jupyter_gpushare.core.slice_request import make_slice_request, stored_label

GiB = 2**30
MiB = 2**20


def test_none_takes_the_configured_defaults() -> None:
    request = make_slice_request(None, None, None, "6G", "vgpu")
    assert request.size.resolve(0) == 6 * GiB
    assert request.mode.name == "vgpu"
    assert request.cores is None


@pytest.mark.parametrize(
    ("memory", "mode", "expected_bytes", "expected_mode"),
    [
        ("8G", "timeslice", 8 * GiB, "timeslice"),
        ("512M", "mps", 512 * MiB, "mps"),
        (4096, "mig", 4096 * MiB, "mig"),  # a JSON number is MiB
        ("4096", None, 4096 * MiB, "timeslice"),
    ],
)
def test_explicit_fields(memory: object, mode: str | None, expected_bytes: int, expected_mode: str) -> None:
    request = make_slice_request(memory, mode, None, "4G", "timeslice")
    assert request.size.resolve(80 * GiB) == expected_bytes
    assert request.mode.name == expected_mode


def test_a_share_stays_a_share() -> None:
    request = make_slice_request("25%", "timeslice", None, "4G", "timeslice")
    assert request.size.resolve(16 * GiB) == 4 * GiB
    assert request.size.resolve(80 * GiB) == 20 * GiB


@pytest.mark.parametrize("memory", ["4G", "whole", None, "25%"])
def test_exclusive_always_means_a_whole_card(memory: object) -> None:
    request = make_slice_request(memory, "exclusive", None, "4G", "timeslice")
    assert request.size.is_whole
    assert request.size.resolve(40 * GiB) == 40 * GiB


def test_exclusive_as_the_default_mode_also_means_a_whole_card() -> None:
    assert make_slice_request("2G", None, None, "4G", "exclusive").size.is_whole


@pytest.mark.parametrize(
    ("memory", "said"),
    [
        ("abc", ACCEPTED_FORMS),
        ("0", "must be more than zero"),
        ("-1G", "must be more than zero"),
        ("10T", ACCEPTED_FORMS),
        ("101%", "must be from 0.01% to 100%"),
        (0, "must be more than zero"),
        (True, ACCEPTED_FORMS),
        (2.5, ACCEPTED_FORMS),
        (["4G"], ACCEPTED_FORMS),
    ],
)
def test_a_bad_size_says_what_is_wrong(memory: object, said: str) -> None:
    """The accepted forms where the form is what is wrong, the range where it is not (issue 25)."""
    with pytest.raises(InvalidRequestError) as caught:
        make_slice_request(memory, "timeslice", None, "4G", "timeslice")
    assert said in str(caught.value)
    assert (ACCEPTED_FORMS in str(caught.value)) is (said == ACCEPTED_FORMS)
    assert isinstance(caught.value, ValueError)


def test_a_bad_default_size_is_reported_too() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        make_slice_request(None, None, None, "lots", "timeslice")
    assert ACCEPTED_FORMS in str(caught.value)


@pytest.mark.parametrize("mode", ["bogus", "MIG", "shared", 3])
def test_a_bad_mode_lists_the_modes(mode: object) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        make_slice_request("4G", mode, None, "4G", "timeslice")
    for name in MODES:
        assert name in str(caught.value)


@pytest.mark.parametrize(
    ("cores", "expected"), [(None, None), (1, 1), (30, 30), (100, 100), ("30", 30), ("30%", 30), (" 50 ", 50)]
)
def test_cores(cores: object, expected: int | None) -> None:
    assert make_slice_request("4G", "mps", cores, "4G", "timeslice").cores == expected


@pytest.mark.parametrize(
    "cores",
    # Digits of other scripts, which int() reads, are refused as the OpenAPI pattern ^[0-9]+%?$ says.
    [0, 101, -5, "abc", True, False, 2.5, "2.5", "0%", "150%", [30], "٥٠", "５٠", "50%%", "+50", "5 0"],
)
def test_bad_cores_say_what_is_allowed(cores: object) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        make_slice_request("4G", "mps", cores, "4G", "timeslice")
    message = str(caught.value)
    assert "gpu_cores" in message
    assert "1" in message and "100" in message


def test_an_amount_below_the_smallest_slice_is_refused_with_the_trait_named() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        make_slice_request("0.0000001G", None, None, "4G", "timeslice", min_memory=256 * 2**20)
    assert "at least 256M (GPUShare.min_memory), not 0.0000001G" in str(caught.value)
    assert make_slice_request("256M", None, None, "4G", "timeslice", 256 * 2**20).size.canonical == "256M"
    # A share is checked where it lands (the allocator), a whole card is always large enough.
    assert make_slice_request("1%", None, None, "4G", "timeslice", 256 * 2**20).size.form == "percent"


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("work/x.ipynb", "work/x.ipynb"),
        ("a\x00b\nc", "a\ufffdb\ufffdc"),
        ("\ud800.ipynb", "\ufffd.ipynb"),
        ("é" * 3000, "é" * 2048),  # cut at a character boundary: 2 bytes each
    ],
)
def test_names_and_paths_are_stored_harmless(text: str, stored: str) -> None:
    assert stored_label(text, 4096) == stored
