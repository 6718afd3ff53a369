"""`manager install`: sync, then launch the toolkit (unless --no-launch).

The sync is `manager sync`'s; the cli layer releases the lock before launching, so a
running toolkit never blocks a later sync or update.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from manager.commands import sync
from manager.output import Result

render = sync.render


@dataclass(frozen=True)
class Options:
    sync: sync.Options = field(default_factory=sync.Options)
    launch: bool = True

    def to_argv(self) -> list[str]:
        return [*self.sync.to_argv(), *([] if self.launch else ["--no-launch"])]


def run(options: Options) -> Result:
    return sync.run(options.sync)
