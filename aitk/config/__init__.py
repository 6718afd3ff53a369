"""The job config: upstream's YAML format as a typed schema.

    loading.py        load_config: resolve the file, read it bounded, [name]/${VAR},
                      screen, validate; every problem at once (ConfigError)
    schema.py         the pydantic models, and their errors as field-path lines
    upstream.py       upstream's format screened: refused jobs, derivations, keys aitk
                      drops (a warning) or does not know (an error with a suggestion)
    upstream_keys.py  upstream's keys, defaults, job and process types and archs (data)
    choices.py        allowed values the schema, the code and the README share

Importing this package imports nothing; only loading.py and schema.py import PyYAML
and pydantic, and none of it imports torch.
"""
