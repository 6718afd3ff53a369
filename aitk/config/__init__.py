"""The job config: upstream's YAML format as a typed schema.

    loading.py        resolve the file, read it bounded, [name]/${VAR}, load_config
    upstream_keys.py  upstream's keys, defaults, job and process types and archs (data)
    choices.py        allowed values the schema, the code and the README share

Importing this package imports nothing; each module says what it costs.
"""
