"""What operators see of routing's blank targets and EC tables: ``loomfs admin targets`` marks a
target back on a replaced disk (``TargetInfo.blank``), ``admin tables`` says which tables are EC
groups' (``ChainTable.ec``), ``admin chains``, ``top`` and the dashboard say so too, and ``layout
set --ec`` looks for an EC group's table, not any single-replica one. Routing is handed in; no
sockets."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
from rich.console import Console

from loomfs.cli import admin
from loomfs.cli.layout import ec_capacity_problem
from loomfs.cli.top import render
from loomfs.dashboard.model import build_view
from loomfs.wire.types import (
    ChainInfo,
    ChainTable,
    NodeInfo,
    NodeKind,
    RoutingInfo,
    TargetInfo,
    TargetState,
)

S = TargetState


def _routing(*, blank: dict[int, int] | None = None, ec: bool = True) -> RoutingInfo:
    """Three nodes; chain 1 (table 1, 3 replicas) on targets 1001/2001/3001; table 2 one-replica
    chains 11..13 on targets 1002/2002/3002 (an EC group's if ``ec``). ``blank``: target -> the
    state it is blank in."""
    blank = blank or {}
    targets = []
    for n in (1, 2, 3):
        for i, chain in ((1, 1), (2, 10 + n)):
            tid = n * 1000 + i
            targets.append(TargetInfo(target_id=tid, node_id=n, chain_id=chain, path=f"/d{tid}",
                                      state=blank.get(tid, S.SERVING), blank=tid in blank,
                                      format_id=f"{tid:032x}"))
    return RoutingInfo(
        version=9,
        nodes=[NodeInfo(node_id=n, kind=NodeKind.STORAGE, host="127.0.0.1", port=9000 + n) for n in (1, 2, 3)],
        targets=targets,
        chains=[ChainInfo(chain_id=1, targets=[1001, 2001, 3001], table_id=1)]
        + [ChainInfo(chain_id=10 + n, targets=[n * 1000 + 2], table_id=2) for n in (1, 2, 3)],
        tables=[ChainTable(table_id=1, replicas=3, chain_ids=[1]),
                ChainTable(table_id=2, replicas=1, chain_ids=[11, 12, 13], ec=ec)],
    )


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps a narrow table's cells

    def use(r: RoutingInfo) -> None:
        monkeypatch.setattr(admin, "fetch_routing", lambda args: r)

    return use


def _args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**({"json": False, "target": None} | kw))


def _line_of(out: str, target_id: int) -> str:
    return next(line for line in out.splitlines() if f" {target_id} " in line)


def test_admin_targets_marks_blank_targets(routed: Any, capsys: pytest.CaptureFixture[str]) -> None:
    routed(_routing(blank={2001: S.WAITING, 3001: S.LASTSRV}))
    assert admin.cmd_targets(_args()) == 0
    out = capsys.readouterr().out
    assert "blank: disk replaced, waiting to resync" in _line_of(out, 2001)
    assert "blank: disk replaced, the chain's newest copy is lost" in _line_of(out, 3001)
    assert "lastsrv" in _line_of(out, 3001)
    assert "blank" not in _line_of(out, 1001)


def test_admin_targets_json_carries_blank_and_format_id(routed: Any, capsys: pytest.CaptureFixture[str]) -> None:
    routed(_routing(blank={2001: S.SYNCING}))
    assert admin.cmd_targets(_args(json=True)) == 0
    rows = {r["target"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[2001]["blank"] is True and rows[2001]["state"] == "syncing"  # the state stays the state's name
    assert rows[1001]["blank"] is False
    assert rows[2001]["format_id"] == f"{2001:032x}"


def test_admin_chains_marks_blank_members(routed: Any, capsys: pytest.CaptureFixture[str]) -> None:
    routed(_routing(blank={2001: S.WAITING}))
    assert admin.cmd_chains(_args()) == 0
    assert "2001(waiting, blank)" in capsys.readouterr().out


def test_admin_tables_says_which_are_ec_groups(routed: Any, capsys: pytest.CaptureFixture[str]) -> None:
    routed(_routing())
    assert admin.cmd_tables(_args()) == 0
    out = capsys.readouterr().out
    line1 = next(x for x in out.splitlines() if "replicated" in x)
    line2 = next(x for x in out.splitlines() if "EC group" in x)
    assert " 1 " in line1 and " 3 " in line1
    assert " 2 " in line2 and "11-13" in line2
    assert admin.cmd_tables(_args(json=True)) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["table"], r["replicas"], r["ec"], r["chain ids"]) for r in rows] == [
        (1, 3, False, [1]), (2, 1, True, [11, 12, 13])]


def test_admin_tables_shows_a_replicated_one_replica_table_as_replicated(
        routed: Any, capsys: pytest.CaptureFixture[str]) -> None:
    routed(_routing(ec=False))
    assert admin.cmd_tables(_args(json=True)) == 0
    assert [r["kind"] for r in json.loads(capsys.readouterr().out)] == ["replicated", "replicated"]


def test_layout_set_ec_needs_an_ec_groups_table(routed: Any) -> None:
    """A replicated one-replica table on 3 nodes is no room for ec 2+1 (meta will not place
    EC files on it): the old check counted any single-replica table."""
    routed(_routing(ec=False))
    why = ec_capacity_problem(_args(table=None), (2, 1))
    assert "EC group's chain table" in why and "none" in why
    routed(_routing(ec=True))
    assert ec_capacity_problem(_args(table=None), (2, 1)) == ""
    assert "spans 3" in ec_capacity_problem(_args(table=None), (4, 2))
    routed(_routing(ec=False))  # a table named explicitly is taken as it is (meta does too)
    assert ec_capacity_problem(_args(table=2), (2, 1)) == ""


def test_dashboard_and_top_show_blank_targets_and_ec_tables() -> None:
    v = build_view(_routing(blank={2001: S.WAITING}), {}, {}, now_s=1.0)
    t = {x["target_id"]: x for x in v["targets"]}
    assert t[2001]["blank"] and t[2001]["note"] == "blank: disk replaced, waiting to resync"
    assert not t[1001]["blank"] and t[1001]["note"] == ""
    assert t[2001]["format_id"] == f"{2001:032x}"
    assert v["totals"]["targets_blank"] == 1
    assert {c["chain_id"]: c["ec"] for c in v["chains"]} == {1: False, 11: True, 12: True, 13: True}
    assert [m["blank"] for m in v["chains"][0]["targets"]] == [False, True, False]
    assert [(x["table_id"], x["ec"]) for x in v["tables"]] == [(1, False), (2, True)]
    console = Console(width=300, record=True)
    console.print(render(v))
    screen = console.export_text()
    assert "1 blank" in screen  # the header's count
    assert "waiting blank" in screen and "2 (ec)" in screen
