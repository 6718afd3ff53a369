"""`manager install`: sync, then launch the toolkit (unless --no-launch).

The sync is `manager sync`'s; the cli layer releases the lock before launching, so a
running toolkit never blocks a later sync or update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from manager.commands import sync
from manager.output import Renderer, Result


@dataclass(frozen=True)
class Options:
    sync: sync.Options = field(default_factory=sync.Options)
    launch: bool = True

    def to_argv(self) -> list[str]:
        return [*self.sync.to_argv(), *([] if self.launch else ["--no-launch"])]


def run(options: Options) -> Result:
    return sync.run(dataclasses.replace(options.sync, log_name="install"))


def renderer(launch: bool) -> Renderer:
    """sync's rendering, whose last line says what comes next: the launch, or how to."""
    next_step = ("starting the web UI (python3 -m manager launch)" if launch
                 else sync.NEXT_LAUNCH)

    def render(console: Console, data: Mapping[str, Any]) -> None:
        sync.render(console, data, next_step)

    return render
