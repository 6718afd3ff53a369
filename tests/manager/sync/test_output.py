"""What a sync prints (issue 14): one line per step and one per problem on the terminal,
the installers' output and whole import errors in a log under logs/, a last line that
says what was made and what to do next; `--json` unchanged."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.manager.sync.conftest import Checkout

STEP = re.compile(r"^aitk: \[(\d+)/(\d+)\] ")


def log_files(checkout: Checkout) -> list[Path]:
    return sorted((checkout.root / "logs").glob("*.log"))


def test_a_sync_prints_one_line_per_step_and_per_problem(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    done = checkout.manager("sync")
    assert done.returncode == 0, done.stderr + done.stdout
    err, out = done.stderr.splitlines(), done.stdout.splitlines()

    # stderr: the start line naming the log once, then the steps (and nothing else).
    assert err[0].startswith("aitk: syncing .venv with uv (")
    (log,) = log_files(checkout)
    assert err[0].endswith(f"the installers' output goes to logs/{log.name}")
    steps = [line for line in err if STEP.match(line)]
    total = int(STEP.match(steps[0])[2])
    assert [int(STEP.match(s)[1]) for s in steps] == list(range(1, total + 1))
    others = [line for line in err[1:] if not STEP.match(line)]
    # torchaudio never imports: the one repair the engine tries is said as it happens.
    assert others == ["aitk: torchaudio does not import; reinstalling 2.11.0+bad, forced"]

    # stdout: each problem once, with what to do, then the one-line summary.
    warnings = [line for line in out if line.startswith("warning: ")]
    assert out == [*warnings, out[-1]]
    assert out[-1].startswith("Done: .venv synced with uv (") and "Next: " in out[-1]
    assert "packages changed" in out[-1]
    assert len(warnings) == 3
    for why in ("undefined symbol: _ZN3c10", "no kernel image for this GPU",
                "does-not-exist-anywhere was not found"):
        assert len([line for line in err + out if why in line]) == 1, why  # said once

    # The installers' output and the whole import error are in the log, not on the terminal.
    terminal = done.stdout + done.stderr
    text = log.read_text()
    assert "rebuild it for sm_120" in text and "rebuild it for sm_120" not in terminal
    assert "Resolved" in text and "Resolved" not in terminal
    assert "demo-req: - -> 1.0" in text  # the package-by-package changes
    assert len(err) + len(out) == 1 + total + len(others) + len(warnings) + 1


def test_json_output_is_unchanged_and_names_the_log(uv_checkout: Checkout) -> None:
    done = uv_checkout.manager("sync", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)  # stdout is the one JSON document
    assert {"schema_version", "command", "ok", "exit_code", "data", "messages",
            "error"} == set(document)
    (log,) = log_files(uv_checkout)
    assert document["data"]["log"] == str(log)
    assert "rebuild it for sm_120" in log.read_text()
    assert "rebuild it for sm_120" not in done.stderr


def test_a_failed_install_names_the_log_in_its_hint(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    checkout.requirements("does-not-exist-anywhere==1.0")
    done = checkout.manager("sync")
    assert done.returncode != 0
    (log,) = log_files(checkout)
    assert f"the installer's output is in logs/{log.name}" in done.stderr
    assert "does-not-exist-anywhere" in log.read_text()
