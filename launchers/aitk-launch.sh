#!/bin/sh
# Desktop launcher (Linux .desktop, macOS .command): update the checkout, then start the
# toolkit. Output goes to the window and to logs/launcher.log in the checkout. When
# something fails the window stays open with the error until Enter is pressed.
#
# Exit status: the launch's; 1 when no Python 3.10+ is found.
set -u

root=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd -P) || exit 1
cd "$root" || exit 1
# shellcheck source-path=SCRIPTDIR/.. source=launchers/python.sh
. "$root/launchers/python.sh"

mkdir -p "$root/logs"
log="$root/logs/launcher.log"
status_file="$root/logs/.launcher-status.$$"
# Keep one previous log: a launcher used every day must not fill the disk.
if [ -f "$log" ] && [ "$(wc -c < "$log")" -gt 5000000 ]; then
    mv -f "$log" "$log.1"
fi

# Ctrl+C reaches the manager, which forwards it to the trainer and waits for it to save;
# this shell only keeps waiting (a trap, not an ignore, so children keep the default).
trap ':' INT

say() {
    printf 'aitk: %s\n' "$*" | tee -a "$log"
}

# run_logged CMD...: run CMD with its output in the window and the log; return its status.
# (POSIX sh has no pipefail, so the status travels through a file; the pipeline's left
# side is a subshell, which resets traps, hence the trap again inside it.)
run_logged() {
    printf '\n== %s  %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$*" >> "$log"
    { trap ':' INT; "$@" 2>&1; echo "$?" > "$status_file"; } | tee -a -i "$log"
    code=$(cat "$status_file" 2>/dev/null) || code=1
    rm -f "$status_file"
    return "${code:-1}"
}

keep_open() {
    say "the log is $log"
    if [ -t 0 ]; then
        printf 'Press Enter to close this window. '
        read -r _ || true
    fi
}

if aitk_pythonhome_breaks "$root"; then
    say "PYTHONHOME=$PYTHONHOME stops Python from starting; running without it"
    unset PYTHONHOME
fi

if ! python=$(aitk_find_python "$root"); then
    say "no Python 3.10 or newer found: run ./install.sh in $root first"
    keep_open
    exit 1
fi

failed=0
if ! run_logged "$python" -m manager update --auto; then
    say "update failed (see above); starting the version already installed"
    failed=1
fi
run_logged "$python" -m manager launch
code=$?
if [ "$code" -ne 0 ]; then
    say "the toolkit stopped with exit status $code (see above)"
    failed=1
fi
if [ "$failed" -ne 0 ]; then
    keep_open
fi
exit "$code"
