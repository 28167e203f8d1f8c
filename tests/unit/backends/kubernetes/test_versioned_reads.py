"""What the watch shows, read once per version of each object: a broker reads every kernel pod
(and node) for each start it admits, and only the objects that moved are read again (pure)."""

from __future__ import annotations

from typing import Any

from jupyter_gpushare.backends.kubernetes.cluster.clients import read_versioned
from jupyter_gpushare.backends.kubernetes.objects.pool import PodSlice, read_pod

from .test_pool import pod


def versioned(manifest: dict[str, Any], version: str) -> dict[str, Any]:
    return {**manifest, "metadata": {**manifest["metadata"], "resourceVersion": version}}


def test_each_object_is_read_again_only_once_its_version_moved() -> None:
    read: list[str] = []

    def counted(obj: dict[str, Any]) -> PodSlice | None:
        read.append(str(obj["metadata"]["name"]))
        return read_pod(obj)

    known: dict[str, tuple[object, PodSlice | None]] = {}
    first = [versioned(pod("k1"), "1"), versioned(pod("k2", owner="bob"), "2")]
    assert [item.kernel_id for item in read_versioned(first, counted, known)] == ["k1", "k2"]
    assert len(read) == 2
    # Nothing moved: nothing read, the same slices.
    assert read_versioned(first, counted, known) == read_versioned(first, counted, known)
    assert len(read) == 2
    # k2 moved (its pod was bound elsewhere): k2 alone is read again, and what it says now counts.
    moved = versioned(pod("k2", owner="bob", node_name="gpu-2"), "5")
    again = read_versioned([first[0], moved], counted, known)
    assert len(read) == 3 and [item.node for item in again] == ["gpu-1", "gpu-2"]
    # k1 went: it is forgotten, and a pod of that name later is read afresh.
    assert [item.kernel_id for item in read_versioned([moved], counted, known)] == ["k2"]
    assert set(known) == {moved["metadata"]["name"]}


def test_an_object_that_reads_as_nothing_is_left_out_and_not_read_again() -> None:
    calls: list[str] = []

    def nothing(obj: dict[str, Any]) -> None:
        calls.append(str(obj["metadata"]["name"]))
        return None

    other = {"metadata": {"name": "not-a-kernel", "resourceVersion": "7"}}
    known: dict[str, tuple[object, None]] = {}
    assert read_versioned([other], nothing, known) == []
    assert read_versioned([other], nothing, known) == []
    assert calls == ["not-a-kernel"]
    # Without a version it cannot be told unchanged: read each time.
    bare = {"metadata": {"name": "bare"}}
    read_versioned([bare], nothing, known)
    read_versioned([bare], nothing, known)
    assert calls == ["not-a-kernel", "bare", "bare"]
