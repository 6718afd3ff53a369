"""`manager launch [CONFIG ...]` (contract stub; issue 7 implements it).

Runs the trainer in the managed environment and returns the trainer's exit code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    configs: tuple[str, ...] = ()


def run(options: Options) -> int:
    raise NotImplementedError
