"""`manager tools [--provision]`: which copy of each tool is used, and provisioning."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from manager import tools
from manager.output import Result
from manager.paths import paths

NO_SHARED_LIBS = ("no shared libraries, so torchcodec cannot use it; "
                  "AITK_ALLOW_UNVERIFIED=ffmpeg installs the shared build")


@dataclass(frozen=True)
class Options:
    provision: bool = False


def run(options: Options) -> Result:
    p = paths()
    notes: list[str] = []
    data: dict[str, Any] = {"platform": tools.platform_name()}
    if options.provision:
        data["provisioned"] = tools.provision_all(p, notes.append)
    data["tools"] = tools.report_tools(p)
    return Result(data=data, messages=tuple(notes))


def render(console: Console, data: Mapping[str, Any]) -> None:
    table = Table(title=f"Tools ({data.get('platform')})", title_justify="left")
    for column in ("tool", "used", "version", "minimum", "ok", "path / why not"):
        table.add_column(column)
    for row in data.get("tools", []):
        ok = "yes" if row["ok"] else "no"
        if row["ok"] and row.get("verified") is False:
            ok = "yes (unverified)"
        where = row["path"] if row["ok"] else row["detail"]
        if row["ok"] and row.get("shared_libraries") is False:
            where = f"{where} (program only: {NO_SHARED_LIBS})"
        table.add_row(row["tool"], row["used"] or "-", row["version"] or "-", row["minimum"],
                      ok, where or "")
    console.print(table)
