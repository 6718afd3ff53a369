"""`sync` with nothing to do, answered before the command line loads.

typer, click, rich and httpx were most of a no-op sync's wall time (0.84 s against
uv's own no-op at 0.09 s, issue 27). A plain `sync` ([--cpu] [--json] [--dry-run], the
launchers' and scripts' call) first asks commands.sync.answer_without_changes, which
reads what `check` reads, without the lock; when nothing would change, its answer is
printed here, the same document or lines the full command prints. Anything else (other
flags, work to do, something to recover, any error) goes to the full command line,
which takes the lock and reports properly. An answer with nothing to do is recorded for
the bootstrap, which prints it again while nothing it reads changes (noop_memo.py).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

FLAGS = frozenset({"--cpu", "--json", "--dry-run"})


def main(argv: Sequence[str]) -> int | None:
    """The exit code when this call was answered here; None: run the full command line."""
    if not argv or argv[0] != "sync" or not set(argv[1:]) <= FLAGS:
        return None
    flags = set(argv[1:])
    from manager.commands import sync
    from manager.errors import EXIT_INTERRUPTED

    try:
        result = sync.answer_without_changes(
            sync.Options(cpu="--cpu" in flags, dry_run="--dry-run" in flags))
    except KeyboardInterrupt:
        sys.stderr.write("aitk: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception:  # noqa: BLE001 - the full command line meets it again and says it
        return None
    if result is None:
        return None
    if "--json" in flags:
        from manager.output import envelope, json_text

        text = json_text(envelope("sync", result))
    else:
        text = "".join(f"{line}\n" for line in sync.unchanged_lines(result.data) or ())
    sys.stdout.write(text)
    sys.stdout.flush()
    if not result.data.get("plan"):  # nothing to do: the bootstrap may answer it next time
        from manager import noop_memo
        from manager.paths import paths

        noop_memo.record(paths().root, text, result.exit_code)
    return result.exit_code
