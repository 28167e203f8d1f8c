"""The service API (acquire, resize, release) over a real ledger file and a simulated pool."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from jupyter_gpushare.backends.local import LocalBackend
from jupyter_gpushare.backends.processes import current_process, identify
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core.errors import (
    ConfigurationError,
    DoesNotFitError,
    LedgerDamagedError,
    ModeUnavailableError,
    NoGPUError,
    NotYourSliceError,
    QueueTimeoutError,
)
from jupyter_gpushare.core.sizes import ACCEPTED_FORMS
from tests.support.nvml_fake import FakeBoard
from tests.support.polling import async_wait_until

GiB = 2**30


def make_service(tmp_path: Path, simulate: str = "1xT4-16GB", **traits: object) -> LocalBackend:
    settings = GPUShare(
        simulate=simulate,
        ledger_path=str(tmp_path / "ledger.sqlite"),
        owner=str(traits.pop("owner", "alice")),
        queue_poll_interval=0.02,
        **{"queue_timeout": 10.0, **traits},
    )
    return LocalBackend(settings)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[LocalBackend]:
    service = make_service(tmp_path)
    yield service
    service.ledger.close()


async def test_acquire_gives_a_slice_and_the_kernel_environment(service: LocalBackend) -> None:
    record = await service.acquire("k1", service.check("4G"), kernel_name="spec", path="a.ipynb")
    assert record.state == "running"
    assert record.memory == 4 * GiB
    env = service.kernel_env(record)
    assert env["CUDA_VISIBLE_DEVICES"] == service.devices()[0].uuid
    assert env["JUPYTER_GPUSHARE_MEMORY_BYTES"] == str(4 * GiB)
    assert env["JUPYTER_GPUSHARE_MODE"] == "timeslice"
    # 4G less the CUDA context allowance (768M) of the 16G card
    assert Decimal(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == Decimal("0.2031")
    assert service.free("k1") is not None
    assert service.ledger.records() == []


async def test_defaults_come_from_the_settings(tmp_path: Path) -> None:
    service = make_service(tmp_path, default_memory="2G", default_mode="mps")
    record = await service.acquire("k1", service.check())
    assert (record.memory, record.mode) == (2 * GiB, "mps")


async def test_mig_kernels_are_capped_to_their_instance(tmp_path: Path) -> None:
    service = make_service(tmp_path, simulate="1xA100-80GB:mig=1x3g.40gb+2x1g.10gb")
    record = await service.acquire("k1", service.check("5G", "mig"))
    env = service.kernel_env(record)
    assert env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert env["JUPYTER_GPUSHARE_MEMORY_BYTES"] == str(10 * GiB)
    assert Decimal(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == Decimal("0.925")  # 10G less 768M


async def test_when_full_fail_refuses_with_the_free_memory_and_reserves_nothing(tmp_path: Path) -> None:
    service = make_service(tmp_path, when_full="fail")
    await service.acquire("k1", service.check("12G"))
    with pytest.raises(DoesNotFitError) as caught:
        await service.acquire("k2", service.check("8G"))
    assert "4G free on GPU0" in str(caught.value)
    assert [record.kernel_id for record in service.ledger.records()] == ["k1"]


async def test_a_request_larger_than_every_device_is_refused_at_once(service: LocalBackend) -> None:
    with pytest.raises(DoesNotFitError) as caught:
        await service.acquire("k1", service.check("20G"))
    message = str(caught.value)
    assert "16G" in message
    assert service.ledger.records() == []


async def test_a_request_larger_than_every_device_names_the_largest(service: LocalBackend) -> None:
    # Its form is fine: the message says what is too large, not every form a size may take
    # (issue 25; docs/users/sizes.md lists the accepted forms for the sizes that cannot be read).
    with pytest.raises(DoesNotFitError) as caught:
        await service.acquire("k1", service.check("20G"))
    assert "20G is larger than any GPU in the pool (largest: " in str(caught.value)
    assert ACCEPTED_FORMS not in str(caught.value)


async def test_quota_from_the_settings(tmp_path: Path) -> None:
    service = make_service(tmp_path, max_memory_per_kernel="6G")
    with pytest.raises(DoesNotFitError, match="6G"):
        await service.acquire("k1", service.check("8G"))
    assert service.ledger.records() == []


async def test_a_queued_request_is_placed_when_memory_comes_back(service: LocalBackend) -> None:
    await service.acquire("k1", service.check("12G"))
    waits: list[tuple[int, str]] = []
    waiting = asyncio.create_task(
        service.acquire("k2", service.check("8G"), on_wait=lambda *wait: waits.append(wait))
    )
    await async_wait_until(lambda: waits, 2, 0.01, "the wait reported")
    assert waits[0][0] == 1
    assert "free on GPU0" in waits[0][1]
    assert service.ledger.queue_position("k2") == 1
    assert not waiting.done()
    service.free("k1")
    record = await asyncio.wait_for(waiting, 5)
    assert record.memory == 8 * GiB


async def test_queue_timeout_withdraws_the_request(tmp_path: Path) -> None:
    service = make_service(tmp_path, queue_timeout=0.1)
    await service.acquire("k1", service.check("12G"))
    with pytest.raises(QueueTimeoutError) as caught:
        await service.acquire("k2", service.check("8G"))
    assert "free on GPU0" in str(caught.value)
    assert [record.kernel_id for record in service.ledger.records()] == ["k1"]


async def test_cancelling_a_wait_withdraws_the_request(service: LocalBackend) -> None:
    await service.acquire("k1", service.check("12G"))
    waiting = asyncio.create_task(service.acquire("k2", service.check("8G")))
    await async_wait_until(lambda: service.ledger.get("k2") is not None, 2, 0.01, "k2 queued")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert service.ledger.get("k2") is None


async def test_a_restarted_kernel_gets_its_slice_back(service: LocalBackend) -> None:
    first = await service.acquire("k1", service.check("4G"))
    again = await service.acquire("k1", service.check("4G"))
    assert again.unit_uuid == first.unit_uuid
    assert len(service.ledger.records()) == 1


async def test_resize(service: LocalBackend) -> None:
    await service.acquire("k1", service.check("4G"))
    await service.acquire("k2", service.check("4G"))
    assert service.resize("k1", "10G").memory == 10 * GiB
    with pytest.raises(DoesNotFitError) as caught:
        service.resize("k1", "14G")
    assert "2G free on GPU0" in str(caught.value)
    assert service.ledger.get("k1").memory == 10 * GiB


def test_make_request_checks_the_mode_against_the_node(tmp_path: Path, fake_nvml) -> None:
    fake_nvml([FakeBoard("GPU-real", "NVIDIA L4", 24 * GiB)])
    service = make_service(tmp_path, simulate="")
    assert not service.inventory.simulated
    with pytest.raises(ModeUnavailableError, match="nvidia-cuda-mps-control"):
        service.check("4G", "mps")
    with pytest.raises(ModeUnavailableError, match="libvgpu_path"):
        service.check("4G", "vgpu")
    assert service.check("4G", "timeslice").size.resolve(0) == 4 * GiB


def test_make_request_without_any_gpu(tmp_path: Path) -> None:
    service = make_service(tmp_path, simulate="")
    with pytest.raises(NoGPUError, match="no GPU found"):
        service.check("4G")


def test_a_second_server_on_the_ledger_sees_the_slices_anonymously(tmp_path: Path) -> None:
    alice = make_service(tmp_path, owner="alice")
    asyncio.run(alice.acquire("k1", alice.check("4G"), path="private.ipynb"))
    bob = make_service(tmp_path, owner="bob", when_full="fail")
    (entry,) = bob.all_kernels()
    assert entry["kernel_id"] is None and entry["owner"] == "another user" and not entry["path"]
    assert bob.pool()["devices"][0]["memory_reserved"] == 4 * GiB
    with pytest.raises(DoesNotFitError):
        asyncio.run(bob.acquire("k2", bob.check("14G")))  # 12G free
    assert [record.kernel_id for record in bob.ledger.records()] == ["k1"]


async def test_a_scoped_backend_asks_as_its_caller_and_shows_others_anonymous(tmp_path: Path) -> None:
    from jupyter_gpushare.backends.processes import current_process
    from jupyter_gpushare.core.records import Placed
    from jupyter_gpushare.core.visibility import EVERYONE

    service = make_service(tmp_path, simulate="1xA100-80GB", max_memory_per_user="8G")
    bob = service.scoped("bob", "bob@box:1", current_process(), "bob")
    alice = service.scoped("alice", "alice@box:2", current_process(), "alice")
    placed = bob.ask("kb", bob.check("6G"), token_hash="ab" * 32)
    assert isinstance(placed, Placed) and placed.record.owner == "bob"
    assert placed.record.server_id == "bob@box:1" and placed.record.token_hash == "ab" * 32
    # Each user's own budget: bob's 6G is not alice's.
    assert isinstance(alice.ask("ka", alice.check("6G")), Placed)
    with pytest.raises(DoesNotFitError, match="per-user limit of 8G"):
        bob.check("4G")
    # The ledger's transaction holds the limit too, for a request checked before bob's 6G.
    from jupyter_gpushare.core.slice_request import make_slice_request

    refused = bob.ask("kb2", make_slice_request("4G", None, None, "4G", "timeslice"))
    assert "per-user limit of 8G" in refused.reason  # type: ignore[union-attr]
    assert [record.kernel_id for record in service.ledger.records()] == ["kb", "ka"]
    seen = {view["kernel_id"]: view["owner"] for view in alice.all_kernels()}
    assert seen == {None: "another user", "ka": "alice"}
    everyone = service.scoped("root", "root@box:3", current_process(), EVERYONE)
    assert {view["kernel_id"] for view in everyone.all_kernels()} == {"ka", "kb"}


async def test_a_waiting_request_is_refused_once_the_queue_timeout_passed(tmp_path: Path) -> None:
    from jupyter_gpushare.core.records import Refused, Waiting

    service = make_service(tmp_path, queue_timeout=0.2)
    await service.acquire("k1", service.check("12G"))
    waiting = service.ask("k2", service.check("8G"))
    assert isinstance(waiting, Waiting) and waiting.position == 1
    await asyncio.sleep(0.25)
    refused = service.poll("k2")
    assert isinstance(refused, Refused) and refused.timed_out and "after waiting" in refused.reason
    assert [record.kernel_id for record in service.ledger.records()] == ["k1"]  # withdrawn


def test_local_kernels_are_encrypted_where_other_users_share_the_node(tmp_path: Path) -> None:
    import os

    from jupyter_gpushare.backends.local.encryption import encrypts_local_kernels

    ledger = tmp_path / "ledger.sqlite"
    alone = GPUShare(ledger_path=str(ledger))
    assert not encrypts_local_kernels(alone)  # no ledger yet: nobody else
    ledger.touch(mode=0o600)
    os.chmod(ledger, 0o600)
    assert not encrypts_local_kernels(alone)
    os.chmod(ledger, 0o660)  # a ledger a group shares
    assert encrypts_local_kernels(alone)
    assert not encrypts_local_kernels(GPUShare(ledger_path=str(ledger), encrypt=False))
    assert encrypts_local_kernels(GPUShare(broker_url="unix:/run/broker.sock"))


def test_a_disabled_policy_counts_only_where_the_configuration_sets_it(tmp_path: Path) -> None:
    """The node's requirement (a shared ledger) wins over jupyter_client's default "disabled",
    and gives way to nothing but a refusal where a configuration section says "disabled"."""
    from jupyter_client.ioloop import AsyncIOLoopKernelManager
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
    from traitlets.config import Config

    from jupyter_gpushare.backends.local.encryption import local_encryption, policy_setting

    ledger = tmp_path / "ledger.sqlite"
    ledger.touch()
    os.chmod(ledger, 0o660)
    shared = GPUShare(ledger_path=str(ledger))

    def manager(config: dict[str, dict[str, str]], **traits: str) -> AsyncIOLoopKernelManager:
        server = AsyncMappingKernelManager(config=Config(config))
        return AsyncIOLoopKernelManager(parent=server, **traits)

    unset = manager({})
    assert policy_setting(unset) is None
    assert local_encryption(shared, unset) == "required"
    assert local_encryption(GPUShare(ledger_path=str(tmp_path / "alone.sqlite")), unset) is None
    assert local_encryption(shared, manager({}, transport_encryption="auto")) == "required"
    for section in ("KernelManager", "AsyncIOLoopKernelManager", "MappingKernelManager"):
        disabled = manager({section: {"transport_encryption": "disabled"}})
        assert policy_setting(disabled) == f"c.{section}.transport_encryption"
        with pytest.raises(
            ConfigurationError, match=rf"c\.GPUShare\.encrypt .* c\.{section}\.transport_encryption"
        ):
            local_encryption(shared, disabled)
        assert local_encryption(GPUShare(ledger_path=str(ledger), encrypt=False), disabled) is None


async def test_only_the_kernel_that_gave_a_slice_back_may_claim_its_id_again(
    service: LocalBackend,
) -> None:
    record = await service.acquire("k1", service.check("4G"), kernel_name="spec", path="x.ipynb")
    token = service.token_for("k1")
    assert token is not None and record.token_hash is not None
    service.give_back("k1")
    me = current_process()
    service.check_claim("k1", token, me)  # this process holds the token: it is that kernel
    with pytest.raises(NotYourSliceError, match="belongs to another kernel"):
        service.check_claim("k1", None, me)
    with pytest.raises(NotYourSliceError):
        service.check_claim("k1", "someone-elses-token", me)
    other = identify(os.getppid())  # a process that is neither this one nor runs under it
    assert other is not None
    with pytest.raises(NotYourSliceError):  # the token, but from another process
        service.check_claim("k1", token, other)
    child = subprocess.Popen(["sleep", "30"])
    try:
        inside = identify(child.pid)
        assert inside is not None
        service.check_claim("k1", token, inside)  # a process the kernel started may
    finally:
        child.kill()
        child.wait()
    # Name and path come back with the next slice under the id.
    again = await service.acquire("k1", service.check("2G"))
    assert (again.kernel_name, again.path) == ("spec", "x.ipynb")
    service.check_claim("k-never-released", None, me)  # nothing to protect there


def test_a_broken_ledger_does_not_stop_the_service_and_the_pool_says_why(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"garbage " * 1024)
    service = make_service(tmp_path)
    pool = service.pool()
    assert pool["devices"] == [] and pool["problem"].startswith(f"The GPU ledger {path} is damaged")
    with pytest.raises(LedgerDamagedError):
        service.check("4G")
    path.unlink()
    assert service.ledger.check() is None  # the guard's round: the pool is registered now
    assert "problem" not in service.pool()
    assert service.check("4G").size.canonical == "4G"


async def test_a_kernel_proves_its_slice_with_its_own_token_only(service: LocalBackend) -> None:
    record = await service.acquire("k1", service.check("4G"), kernel_name="spec", path="x.ipynb")
    token = service.token_for("k1")
    assert token is not None and service.kernel_env(record)["JUPYTER_GPUSHARE_TOKEN"] == token
    owned = service.own_slice("k1", token)
    assert owned is not None and owned.kernel_id == "k1"
    with pytest.raises(NotYourSliceError):
        service.own_slice("k1", "another-kernels-token")
    assert service.own_slice("k2", token) is None  # no slice: nothing to prove
    service.free("k1")
