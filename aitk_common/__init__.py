"""Runtime pieces the three programs share: the manager (`manager/`), the trainer
(`aitk/`) and the web UI's server (`aitk_server/`).

Stdlib only, and importing this package imports nothing: the manager's bootstrap runs
on a bare Python before `.venv` exists, and `run.py --check` must stay light. Each
module owns one concern and is the only copy of it:

    files      atomic writes (temp file in the same folder, fsync, os.replace), staged
               folders published by a rename, free-space checks
    procs      is a process alive; a process identity (pid + start time) that survives
               pid reuse; children in their own process group (POSIX and Windows)
    jobstates  the web UI's job states and the actions each allows
    records    the run record `.aitk-run/<pid>.json` and the output folder's lock
               holder `.aitk.lock.json`: typed, versioned, one writer and one reader
    status     the trainer's `status.json`: Phase, the typed Status, read and write
    yamlload   YAML and JSON read within size, value-count (aliases expanded) and
               depth limits; PyYAML imported only when a document is read
"""
