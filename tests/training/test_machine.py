"""The machine a run's generations ran on, and its probe time (``training.machine``)."""

import math

from agentic_esopt.training import machine


def test_the_machine_is_this_boot_of_this_machine(monkeypatch, tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("3f2b9c1e-boot\n")
    monkeypatch.setattr(machine, "BOOT_ID", str(boot))
    assert machine.machine_id() == "3f2b9c1e-boot"
    monkeypatch.setattr(machine, "BOOT_ID", str(tmp_path / "absent"))
    monkeypatch.setattr(machine.platform, "node", lambda: "host-7")
    assert machine.machine_id() == "host-7"


def test_describe_gives_the_machine_and_a_probe_time_that_grows_with_the_work(monkeypatch):
    described = machine.describe()
    assert set(described) == {"machine", "probe_s"} and described["machine"]
    assert 0 < described["probe_s"] and math.isfinite(described["probe_s"])
    # The prefill and eight decode steps take longer than the prefill alone: the probe
    # waits for the work it times (not only for its dispatch).
    monkeypatch.setattr(machine, "NEW_TOKENS", 0)
    machine._turn.clear_cache()  # pylint: disable=protected-access
    prefill = machine.probe_seconds()
    monkeypatch.setattr(machine, "NEW_TOKENS", 8)
    machine._turn.clear_cache()  # pylint: disable=protected-access
    assert machine.probe_seconds() > prefill
