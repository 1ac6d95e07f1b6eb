"""convlab.aten.cpu_cache: the L2 size read from a sysfs folder (a fake one here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from convlab.aten import cpu_cache


def fake_sysfs(root: Path, caches: list[tuple[str, str, str]]) -> Path:
    """``root/index{i}/{level,type,size}`` for each (level, type, size)."""
    for i, (level, kind, size) in enumerate(caches):
        folder = root / f"index{i}"
        folder.mkdir(parents=True)
        (folder / "level").write_text(level + "\n")
        (folder / "type").write_text(kind + "\n")
        (folder / "size").write_text(size + "\n")
    return root


def test_reads_the_level_2_cache_not_l1_or_l3(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, [("1", "Data", "48K"), ("1", "Instruction", "32K"),
                                 ("2", "Unified", "2048K"), ("3", "Unified", "480M")])
    assert cpu_cache.l2_cache_bytes(root) == 2048 * 1024


def test_an_l2_instruction_cache_does_not_count(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, [("2", "Instruction", "64K"), ("2", "Data", "1M")])
    assert cpu_cache.l2_cache_bytes(root) == 2**20


@pytest.mark.parametrize("caches", [[], [("1", "Data", "32K"), ("3", "Unified", "8M")],
                                    [("2", "Unified", "garbage")]])
def test_fallback_without_a_readable_l2(tmp_path: Path, caches) -> None:
    root = fake_sysfs(tmp_path / "cache", caches) if caches else tmp_path / "missing"
    assert cpu_cache.l2_cache_bytes(root, fallback=12345) == 12345


def test_the_answer_is_read_once_per_folder(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, [("2", "Unified", "256K")])
    assert cpu_cache.l2_cache_bytes(root) == 256 * 1024
    (root / "index0" / "size").write_text("512K\n")
    assert cpu_cache.l2_cache_bytes(root) == 256 * 1024  # cached
    cpu_cache.l2_cache_bytes.cache_clear()
    assert cpu_cache.l2_cache_bytes(root) == 512 * 1024


def test_a_missing_size_file_is_skipped(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, [("2", "Unified", "256K")])
    (root / "index0" / "size").unlink()
    assert cpu_cache.l2_cache_bytes(root) == cpu_cache.FALLBACK_BYTES


@pytest.mark.parametrize(("text", "want"), [("48K", 49152), ("2M\n", 2**21), ("1G", 2**30),
                                            ("512", 512), ("64KB", 65536)])
def test_parse_size(text: str, want: int) -> None:
    assert cpu_cache.parse_size(text) == want


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="text"):
        cpu_cache.parse_size("lots")
    with pytest.raises(TypeError, match="text"):
        cpu_cache.parse_size(2048)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fallback"):
        cpu_cache.l2_cache_bytes(fallback=0)


def test_this_machine_gives_a_plausible_size() -> None:
    size = cpu_cache.l2_cache_bytes()
    assert 64 * 1024 <= size <= 1024 * 2**20
