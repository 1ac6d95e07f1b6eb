"""convlab.lab.method.cpu_load: the steal and other-process fractions of a section's time,
from fake /proc/stat readings (nothing here depends on this machine's load)."""

from __future__ import annotations

import pytest

from convlab.lab.method import cpu_load
from convlab.lab.method.cpu_load import Snapshot


def _snap(wall, busy, steal, own, load=(0.5, 0.5, 0.5)):
    return Snapshot(wall=wall, busy_jiffies=busy, steal_jiffies=steal, own_cpu_s=own,
                    load=load)


def test_a_quiet_section():
    # 10 s on 2 cores at 100 Hz: 2000 jiffies of capacity; this process used 10 s of
    # CPU, the machine 1010 jiffies (10.1 s): others 0.1 s of 20 core-seconds
    got = cpu_load.between(_snap(0, 0, 0, 0), _snap(10, 1010, 10, 10), cores=2, hz=100)
    assert got["quiet"] and got["why"] == ""
    assert got["others"] == pytest.approx(0.005) and got["steal"] == pytest.approx(0.005)
    assert got["load_before"] == [0.5, 0.5, 0.5] and got["seconds"] == 10


def test_other_processes_and_steal_flag_a_section():
    others = cpu_load.between(_snap(0, 0, 0, 0), _snap(10, 1600, 0, 10), cores=2, hz=100)
    assert not others["quiet"] and others["others"] == pytest.approx(0.3)
    assert "other processes used 30%" in others["why"]
    steal = cpu_load.between(_snap(0, 0, 0, 0), _snap(10, 1000, 200, 10), cores=2, hz=100)
    assert not steal["quiet"] and "steal 10%" in steal["why"]
    # just under both limits is quiet: the limits are where the flag turns on
    edge = cpu_load.between(_snap(0, 0, 0, 0), _snap(10, 1000 + 199, 99, 10), cores=2,
                            hz=100)
    assert edge["quiet"], edge


def test_without_proc_stat_nothing_is_flagged():
    got = cpu_load.between(_snap(0, None, None, 0, None), _snap(5, None, None, 5, None),
                           cores=2, hz=100)
    assert got["quiet"] and got["steal"] is None and got["others"] is None
    assert got["load_before"] is None


def test_reads_a_stat_file(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 1000 20 3 2 7 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    snap = cpu_load.snapshot(stat)
    assert (snap.busy_jiffies, snap.steal_jiffies) == (100 + 5 + 50 + 3 + 2, 7)
    stat.write_text("intr 1 2 3\n")
    assert cpu_load.snapshot(stat).busy_jiffies is None
    assert cpu_load.snapshot(tmp_path / "absent").steal_jiffies is None


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"cores": 0}, ValueError, "cores"), ({"hz": True}, ValueError, "hz"),
    ({"a": 1}, TypeError, "Snapshot"),
])
def test_bad_input_names_the_argument(kwargs, error, match):
    args = {"a": _snap(0, 0, 0, 0), "b": _snap(1, 0, 0, 0), "cores": 2, "hz": 100, **kwargs}
    with pytest.raises(error, match=match):
        cpu_load.between(**args)
