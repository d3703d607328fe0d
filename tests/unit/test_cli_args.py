"""The CLI's argument handling and formatting, without a cluster (no sockets)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rich.progress import Progress

from loomfs.cli import fs as cli_fs
from loomfs.cli.common import NoCluster, looks_like_address, target
from loomfs.cli.main import build_parser, main


@pytest.mark.parametrize("argv", [
    ["top", "--dir", "D"],
    ["ls", "--dir", "D", "/"],
    ["ls", "-l", "/", "-C", "D"],
    ["admin", "targets", "--dir", "D"],
    ["admin", "fsck", "--dir", "D"],
    ["bench", "--quick", "--dir", "D"],
    ["--dir", "D", "top"],
])
def test_dir_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert args.cluster_dir == "D" and args.mgmtd is None


def test_mgmtd_after_the_subcommand_and_before_is_not_overwritten() -> None:
    p = build_parser()
    assert p.parse_args(["admin", "nodes", "--mgmtd", "h:1"]).mgmtd == "h:1"
    assert p.parse_args(["--mgmtd", "h:2", "admin", "nodes"]).mgmtd == "h:2"
    assert p.parse_args(["-C", "E", "top", "--once"]).cluster_dir == "E"


def test_commands_with_their_own_dir_keep_it() -> None:
    p = build_parser()
    a = p.parse_args(["local", "up", "--dir", "L"])
    assert a.local_dir == "L" and a.cluster_dir is None
    assert p.parse_args(["mount", "--dir", "M", "/mnt"]).mount_dir == "M"


def test_no_cluster_is_a_one_line_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(NoCluster) as e:
        main(["bench", "--quick", "--dir", str(tmp_path / "none")])
    text = str(e.value.code)
    assert "\n" not in text and "loomfs local up" in text and "--start" in text
    with pytest.raises(NoCluster):
        main(["ls", "-C", str(tmp_path), "/"])  # a directory, but no cluster.json


def test_no_cluster_from_the_shell_prints_no_traceback(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "loomfs.cli.main", "bench", "--quick", "--no-progress"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "ValueError" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "--start" in r.stderr


def test_addresses_pass_through(tmp_path: Path) -> None:
    assert looks_like_address("127.0.0.1:8000") and looks_like_address("a:1,b:2")
    assert not looks_like_address(str(tmp_path)) and not looks_like_address("x:y")
    args = build_parser().parse_args(["--mgmtd", "10.0.0.1:8000", "top"])
    assert target(args) == "10.0.0.1:8000"
    assert target(build_parser().parse_args(["top", "--dir", "10.0.0.1:8000"])) == "10.0.0.1:8000"


def test_progress_columns_use_binary_units() -> None:
    prog = Progress(*cli_fs.progress_bar().columns)
    tid = prog.add_task("put", total=200 << 20)
    prog.update(tid, completed=100 << 20)
    task = prog.tasks[0]
    text = cli_fs.BytesColumn().render(task).plain
    assert text == "100.0 MiB / 200.0 MiB"
    assert "MB" not in text.replace("MiB", "")


def test_ls_long_format() -> None:
    base = {"nlink": 1, "uid": 0, "gid": 0, "size": 3 << 20, "mtime_ns": 0, "mode": 0o644}
    entries = [
        {**base, "name": "/d", "type": "directory", "mode": 0o755, "nlink": 2},
        {**base, "name": "/f", "type": "file"},
        {**base, "name": "/l", "type": "link", "mode": 0o777, "destination": "/f"},
    ]
    lines = cli_fs.long_lines(entries, human=True)
    assert [ln[0] for ln in lines] == ["d", "-", "l"]
    assert lines[0].startswith("drwxr-xr-x") and lines[1].startswith("-rw-r--r--")
    assert " root " in lines[1] and "3.0M" in lines[1] and lines[2].endswith("l -> /f")
    assert str(3 << 20) in cli_fs.long_lines(entries, human=False)[1]
    assert [cli_fs.short_size(n) for n in (0, 512, 1536, 5 << 30)] == ["0", "512", "1.5K", "5.0G"]
    assert cli_fs.owner_name(2**31 - 7) == str(2**31 - 7)  # no such user: the number


def test_demo_states_the_durability_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loomfs.cli.demo import durability_lines

    monkeypatch.delenv("LOOMFS_STORAGE_FSYNC_ON_COMMIT", raising=False)
    for i in (1, 2):
        (tmp_path / f"storage{i}").mkdir()
        (tmp_path / f"storage{i}" / "config.toml").write_text(f'port = {8200 + i}\n')
    text = " ".join(durability_lines(str(tmp_path)))
    assert "fsync_on_commit = false on 2 of 2" in text and "R-1" in text and "power loss" in text
    assert "fsync_on_commit = true" in text  # how to get durable-on-ack
    for i in (1, 2):
        (tmp_path / f"storage{i}" / "config.toml").write_text("fsync_on_commit = true\n")
    assert "on the disks of all its replicas" in " ".join(durability_lines(str(tmp_path)))
    monkeypatch.setenv("LOOMFS_STORAGE_FSYNC_ON_COMMIT", "false")
    assert "false on 2 of 2" in " ".join(durability_lines(str(tmp_path)))
    assert "default false" in " ".join(durability_lines("10.0.0.1:8000"))


def test_create_chain_table_takes_targets_per_node() -> None:
    args = build_parser().parse_args(["admin", "create-chain-table", "--replicas", "2", "--targets-per-node", "1"])
    assert (args.replicas, args.targets_per_node) == (2, 1)
    assert build_parser().parse_args(["admin", "create-chain-table"]).targets_per_node == 0
