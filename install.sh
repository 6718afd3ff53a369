#!/bin/sh
# aitk bootstrap: find (or provision) a Python >= 3.10, then hand over to the manager.
#
#   ./install.sh [--cpu] [--no-launch] [...]
#
# Every argument goes to `python3 -m manager install`, which installs (or repairs) the
# environment in .venv and then launches the toolkit unless --no-launch is given.
# Works from any folder, with spaces in the checkout path, and when run again.
# Exit status: the manager's; 1 when no Python 3.10+ could be found or provisioned.
set -eu

root=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd -P)
# shellcheck source-path=SCRIPTDIR source=launchers/python.sh
. "$root/launchers/python.sh"

say() {
    printf 'aitk: %s\n' "$*" >&2
}

# Last resort: a private Python from uv, kept inside the checkout like everything else.
provision_with_uv() {
    uv=$(aitk_find_uv "$root") || return 1
    say "no Python 3.10+ found; installing one with uv into .uv/python"
    UV_PYTHON_INSTALL_DIR="$root/.uv/python" "$uv" python install 3.12 >&2 || return 1
    aitk_find_python "$root"
}

# The manager drops PYTHONHOME for everything it starts; here it would stop the search.
if aitk_pythonhome_breaks "$root"; then
    say "PYTHONHOME=$PYTHONHOME stops Python from starting; running without it"
    unset PYTHONHOME
fi

if ! python=$(aitk_find_python "$root") && ! python=$(provision_with_uv); then
    say "Python 3.10 or newer is needed, and none was found."
    say "Install one, then run this script again:"
    say "  Debian/Ubuntu: sudo apt install python3 python3-venv"
    say "  Fedora:        sudo dnf install python3"
    say "  macOS:         brew install python  (or the installer from python.org)"
    say "  or install uv (https://docs.astral.sh/uv/) and this script provisions Python."
    exit 1
fi

# The manager resolves from the checkout; the bootstrap builds .venv on first use.
cd "$root"
exec "$python" -m manager install "$@"
