"""`python -m aitk audit config CONFIG`: the preflight, plus settings that contradict each
other or will not do what they seem to.

- text-embedding caching with per-step caption changes a cache cannot represent
  (token shuffling, token dropout, random triggers);
- preservation settings (diff_output_preservation) without a trigger word or a class;
- an output folder this config would resume or overwrite (from the preflight);
- sample prompts that lack the trigger word (unlike captions, prompts get none added).
"""

from __future__ import annotations

from typing import Any

from aitk.config.loading import LoadedConfig, load_config
from aitk.config.schema import TrainingProcess as ProcessConfig
from aitk.data.formats import TRIGGER_TAG
from aitk.errors import ConfigError, split_problem
from aitk.findings import Finding, Report, error, warning


def _caching_conflicts(where: str, proc: ProcessConfig, raw: dict[str, Any]
                       ) -> list[Finding]:
    caching = proc.train.cache_text_embeddings or proc.train.unload_text_encoder or \
        any(ds.cache_text_embeddings for ds in proc.datasets)
    if not caching:
        return []
    out = []
    for j, ds in enumerate(raw.get("datasets") or []):
        if not isinstance(ds, dict):
            continue
        path = f"{where}.datasets[{j}]"
        changing = {"shuffle_tokens": bool(ds.get("shuffle_tokens")),
                    "token_dropout_rate": bool(ds.get("token_dropout_rate")),
                    "random_triggers": bool(ds.get("random_triggers")),
                    "keep_tokens": bool(ds.get("keep_tokens"))}
        for key, on in changing.items():
            if on:
                out.append(warning(f"{path}.{key}", "changes the caption at every step, "
                                   "but text embeddings are cached once per caption",
                                   "turn off cache_text_embeddings/unload_text_encoder, or "
                                   f"remove {key}", "cache_conflict"))
    return out


def _preservation(where: str, proc: ProcessConfig, raw: dict[str, Any]) -> list[Finding]:
    train = raw.get("train") or {}
    if not (isinstance(train, dict) and train.get("diff_output_preservation")):
        return []
    out = []  # a missing trigger word is the preflight's finding
    if not train.get("diff_output_preservation_class"):
        out.append(error(f"{where}.train.diff_output_preservation_class", "preservation "
                         "needs a class word (e.g. person)", "set "
                         "diff_output_preservation_class", "preservation"))
    return out


def _prompts_without_trigger(where: str, proc: ProcessConfig) -> list[Finding]:
    trigger = proc.trigger_word
    if not trigger or proc.train.disable_sampling:
        return []
    out = []
    samples = proc.sample.samples
    items = ([(f"{where}.sample.samples[{k}].prompt", s.prompt) for k, s in
              enumerate(samples)] if samples is not None else
             [(f"{where}.sample.prompts[{k}]", p) for k, p in enumerate(proc.sample.prompts)])
    for path, prompt in items:
        if TRIGGER_TAG not in prompt and trigger not in prompt:
            out.append(warning(path, f"prompt lacks the trigger {trigger!r}: the preview "
                               "will not show what the LoRA learned", "add [trigger] to "
                               "the prompt", "prompt_trigger"))
    return out


def conflicts(loaded: LoadedConfig) -> list[Finding]:
    from aitk.audit.preflight import TRAINING_KINDS

    out: list[Finding] = []
    if loaded.kind not in TRAINING_KINDS:  # extract, mod, merge, generate: no training
        return out
    written = loaded.written.get("config", {}).get("process", [])
    for i, proc in enumerate(loaded.job.processes):
        where = f"config.process[{i}]"
        raw = written[i] if i < len(written) and isinstance(written[i], dict) else {}
        out += _caching_conflicts(where, proc, raw)
        out += _preservation(where, proc, raw)
        out += _prompts_without_trigger(where, proc)
    return out


def audit_config(name: str) -> Report:
    from aitk.audit.preflight import preflight

    report = Report("config", name)
    try:
        loaded = load_config(name)
    except ConfigError as exc:
        report.subject = exc.source
        report.findings = [error(path, message, code="config") for path, message in
                           exc.records]
        return report
    report.subject = str(loaded.source)
    report.findings = [warning(*split_problem(w), code="upstream_only")
                       for w in loaded.warnings]
    report.findings += preflight(loaded) + conflicts(loaded)
    procs = loaded.job.processes
    report.summary = {"name": loaded.name, "job": loaded.kind, "processes": len(procs),
                      "archs": [p.model.arch for p in procs if getattr(p, "model", None)]}
    return report
