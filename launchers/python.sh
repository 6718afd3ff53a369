# shellcheck shell=sh
# Sourced by install.sh and aitk-launch.sh: find a Python >= 3.10 for `-m manager`.
# Only functions and no side effects, so sourcing it is always safe.

# aitk_python_ok PATH: is PATH a Python 3.10 or newer?
aitk_python_ok() {
    "$1" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1
}

# aitk_find_python ROOT: print a suitable interpreter (python3, python, then one that
# install.sh provisioned through uv into ROOT/.uv/python); status 1 when there is none.
aitk_find_python() {
    for aitk_name in python3 python; do
        aitk_path=$(command -v "$aitk_name" 2>/dev/null) || continue
        if aitk_python_ok "$aitk_path"; then
            printf '%s\n' "$aitk_path"
            return 0
        fi
    done
    for aitk_path in "$1"/.uv/python/*/bin/python3; do
        if [ -x "$aitk_path" ] && aitk_python_ok "$aitk_path"; then
            printf '%s\n' "$aitk_path"
            return 0
        fi
    done
    return 1
}

# aitk_pythonhome_breaks ROOT: is PYTHONHOME set and does no Python start with it? (One
# left from another installation stops every interpreter, which reads as "no Python".)
aitk_pythonhome_breaks() {
    [ -n "${PYTHONHOME+set}" ] && ! aitk_find_python "$1" >/dev/null
}

# aitk_find_uv ROOT: print a uv binary (the checkout's own .uv/uv first); status 1 if none.
aitk_find_uv() {
    if [ -x "$1/.uv/uv" ]; then
        printf '%s\n' "$1/.uv/uv"
        return 0
    fi
    command -v uv 2>/dev/null
}
