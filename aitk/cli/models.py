"""`python -m aitk models [--json] [--extensions-dir DIR ...]`: list the model archs.

Shows each arch, what it is (its torch-free description: aitk.models.description), the
multiple its image sides take and where it comes from (built-in or which extension);
`--json` carries each whole description (the web UI's model picker reads the same),
then every extension that failed to import with its error, and registry warnings
(duplicate archs, bad entries). Exit codes: 0 listed (broken extensions are reported,
not fatal: the other archs work); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from aitk.cli.boundary import boundary
from aitk.models.registry import Registry, discover


def as_data(registry: Registry) -> dict:
    return {
        "models": [{**e.description.to_json(), "arch": e.arch, "class": e.class_path,
                    "source": e.source} for e in sorted(registry.models.values(),
                                                        key=lambda e: e.arch)],
        "broken_extensions": [{"name": b.name, "path": b.path, "error": b.error}
                              for b in registry.broken],
        "warnings": list(registry.warnings),
    }


def render(data: dict, verbose_errors: dict[str, str] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    table = Table(title="model archs (model.arch in the job config)")
    table.add_column("arch", style="bold")
    table.add_column("what it is")
    table.add_column("sides")
    table.add_column("source")
    for m in data["models"]:
        caps = m.get("capabilities") or {}
        what = m.get("summary") or m["class"]
        if caps.get("video"):
            what += f" (video, {caps['video']} frames{', audio' if caps.get('audio') else ''})"
        if caps.get("control_images"):
            what += f" (edit: up to {caps['control_images']} control image(s))"
        multiple = m.get("size_multiple")
        # Text, not markup: summaries hold brackets ("FLUX.2 [klein]").
        table.add_row(Text(m["arch"]), Text(what), f"x{multiple}" if multiple else "?",
                      Text(m["source"]))
    console.print(table)
    err = Console(stderr=True)
    for b in data["broken_extensions"]:
        err.print(f"[red]broken extension[/red] {b['name']} ({b['path']}): {b['error']}",
                  markup=True, highlight=False, soft_wrap=True)
        if verbose_errors:
            err.print(verbose_errors[b["name"]], markup=False, highlight=False)
    for w in data["warnings"]:
        err.print(f"[yellow]warning[/yellow] {w}", markup=True, highlight=False,
                  soft_wrap=True)


@boundary()
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aitk models",
        description="List model archs: built-in ones and those from extensions/.")
    parser.add_argument("--json", action="store_true", help="print JSON on stdout only")
    parser.add_argument("--extensions-dir", type=Path, action="append", default=[],
                        metavar="DIR", help="also scan packages under DIR (repeatable)")
    parser.add_argument("--verbose", action="store_true",
                        help="show the full traceback of broken extensions")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad input and 0 on --help
        return int(exc.code or 0)
    registry = discover(args.extensions_dir)
    data = as_data(registry)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        render(data, {b.name: b.detail for b in registry.broken} if args.verbose else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
