"""The upstream key tables and derivations (aitk/config/upstream_keys.py) and how load_config
applies them: accepted keys, warnings only for values that change behaviour, once per
key name; arch derivation; structured error records."""

from __future__ import annotations

import copy

import pytest

from aitk.config import upstream_dropped as ud
from aitk.config import upstream_keys as uk
from aitk.config.loading import parse_job, read_config_file
from aitk.errors import ConfigError, split_problem
from tests.aitk.aitk_testing import REPO

EXAMPLE = REPO / "config" / "examples" / "train_lora_example_cpu.yaml"


def raw() -> dict:
    return copy.deepcopy(read_config_file(EXAMPLE))


def proc(r: dict) -> dict:
    return r["config"]["process"][0]


def parse(r: dict):
    return parse_job(r, "job.yml", env={}, check_arch=lambda a: None)


@pytest.mark.parametrize("model,arch", [
    ({}, "sd1"), ({"is_flux": True}, "flux"), ({"is_xl": True}, "sdxl"),
    ({"is_v3": True}, "sd3"), ({"is_lumina2": True}, "lumina2"), ({"is_v2": True}, "sd2"),
    ({"is_v2": True, "is_flux": True}, "sd2"),  # upstream's order: the first flag wins
    ({"arch": "wan22_14b:t2v"}, "wan22_14b"), ({"arch": "flex1"}, "flux"),
    ({"arch": "qwen_image:2512", "is_flux": True}, "qwen_image"), ({"arch": "sd15"}, "sd1"),
])
def test_arch_derivation_follows_upstream(model, arch):
    assert uk.derive_arch(model) == arch


def test_derived_arch_is_what_the_job_gets():
    r = raw()
    del proc(r)["model"]["arch"]
    proc(r)["model"]["is_flux"] = True
    seen = []
    parse_job(r, "job.yml", env={}, check_arch=lambda a: seen.append(a))
    assert seen == ["flux"]
    r = raw()
    proc(r)["model"]["arch"] = "example:tiny"
    assert parse(r).job.config.process[0].model.arch == "example"


STANDARDIZE = ("config.process[0].datasets[0].standardize_images: valid upstream but not "
               "acted on by aitk: " + uk.DROPPED[("datasets", "standardize_images")])


def test_switched_off_settings_stay_quiet_and_switched_on_ones_warn_once():
    r = raw()
    p = proc(r)
    p["train"]["ema_config"] = {"use_ema": False, "ema_decay": 0.99}
    p["sample"]["sample_start_step"] = 0
    p["sqlite_db_path"] = "./aitk_db.db"
    p["performance_log_every"] = 10
    p["datasets"][0]["random_crop"] = False
    p["datasets"].append({**p["datasets"][0], "standardize_images": True})
    p["datasets"][0]["standardize_images"] = True
    assert parse(copy.deepcopy(r)).warnings == [STANDARDIZE]  # once, though both set it
    p["train"]["correct_pred_norm_multiplier"] = 2.0  # nothing with correct_pred_norm off
    assert parse(copy.deepcopy(r)).warnings == [STANDARDIZE]
    p["train"]["correct_pred_norm"] = True
    assert "config.process[0].train.correct_pred_norm_multiplier: valid upstream but not " \
           "acted on by aitk: " + uk.DROPPED[("train", "correct_pred_norm_multiplier")] \
           in parse(r).warnings


def test_upstream_keys_are_accepted_not_suggested():
    r = raw()
    proc(r)["sample"]["guidance_rescale"] = 0.7  # not "did you mean 'guidance_scale'?"
    proc(r)["save"]["save_format"] = "diffusers"
    proc(r)["model"]["layer_offloading"] = True
    loaded = parse(r)
    assert loaded.warnings == ["config.process[0].sample.guidance_rescale: valid upstream "
                               "but not acted on by aitk: " + uk.DROPPED[
                                   ("sample", "guidance_rescale")]]


def test_a_near_miss_of_an_upstream_key_still_gets_a_suggestion():
    r = raw()
    proc(r)["datasets"][0]["shufle_tokens"] = True
    with pytest.raises(ConfigError) as info:
        parse(r)
    assert info.value.problems == ["config.process[0].datasets[0].shufle_tokens: unknown key "
                                   "(did you mean 'shuffle_tokens'?)"]


def test_training_seed_and_locon_follow_upstream():
    r = raw()
    del proc(r)["train"]["seed"]
    proc(r)["training_seed"] = 1234
    proc(r)["network"]["type"] = "locon"
    p = parse(r).job.config.process[0]
    assert p.train.seed == 1234 and p.network.type == "lora"
    r = raw()
    r["config"]["training_seed"] = 99  # job level, as upstream's jobs pass it down
    assert parse(r).job.config.process[0].train.seed == 42  # an explicit train.seed wins


@pytest.mark.parametrize("mutate,start", [
    (lambda r: r.update(job="ensemble"), "job: 'ensemble' is not a job kind aitk runs; it "
     "runs job: extension, train, extract, mod, merge, generate"),
    (lambda r: r.update(job="generate"), "config.process[0].type: process type "
     "'sd_trainer' belongs to `job: extension`, not `job: generate`"),
    (lambda r: proc(r).update(type="textual_inversion_trainer"),
     "config.process[0].type: process type 'textual_inversion_trainer' (textual "
     "inversion) is not supported by aitk"),
    (lambda r: (r.update(job="train"), proc(r).update(type="vae")),
     "config.process[0].type: process type 'vae' (VAE training) is not supported by aitk; "
     "`job: train` runs slider"),
    (lambda r: (proc(r).pop("network"), proc(r).update(adapter={"type": "redux"})),
     "config.process[0].adapter: this process trains an adapter (redux) instead of the "
     "model"),
])
def test_jobs_aitk_does_not_run_stop_with_one_line(mutate, start):
    r = raw()
    proc(r)["train"]["stpes"] = 1  # not listed: the refusal is the only line
    mutate(r)
    with pytest.raises(ConfigError) as info:
        parse(r)
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith(start)


def test_an_upstream_arch_aitk_lacks_stops_with_one_line():
    r = raw()
    proc(r)["model"]["arch"] = "hidream"
    proc(r)["train"]["stpes"] = 1
    with pytest.raises(ConfigError) as info:
        parse_job(r, "job.yml", env={}, check_arch=lambda a: f"arch {a!r} is not supported "
                  "yet; supported: example")
    assert info.value.problems == ["config.process[0].model.arch: arch 'hidream' is not "
                                   "supported yet; supported: example"]


def test_config_errors_carry_path_message_records():
    r = raw()
    proc(r)["train"]["lr"] = "fast"
    proc(r)["zzzz"] = 1
    with pytest.raises(ConfigError) as info:
        parse(r)
    records = dict(info.value.records)
    assert set(records) == {"config.process[0].train.lr", "config.process[0].zzzz"}
    assert records["config.process[0].zzzz"] == "unknown key"
    assert split_problem("no such config file") == ("", "no such config file")


def test_every_upstream_section_maps_to_a_schema_class():
    from aitk.config.kinds import SECTIONS

    mapped = set(SECTIONS.values())
    assert {"job", "config", "process", "network", "save", "sample", "sample.samples",
            "train", "model", "datasets"} <= mapped
    assert set(uk.SECTIONS) - mapped <= {"logging", "train.ema_config"}  # whole sections


def test_content_or_style_reg_is_quiet_as_upstream_never_reads_it():
    """Upstream's TrainConfig sets content_or_style_reg from `content_or_style`: its own
    value changes nothing there, so dropping it changes nothing here."""
    r = raw()
    proc(r)["train"]["content_or_style_reg"] = "style"
    assert parse(r).warnings == []


def _declared() -> dict[str, list[set[str]]]:
    """Section name -> the keys each schema class of that section reads."""
    from aitk.config.kinds import SECTIONS
    from aitk.config.upstream import _field_keys

    found: dict[str, list[set[str]]] = {}
    for model, section in SECTIONS.items():
        found.setdefault(section, []).append(set(_field_keys(model)))
    return found


def test_every_key_aitk_does_not_read_has_one_reason():
    """An upstream key some schema class of its section does not declare is in exactly
    one table of aitk.config.upstream_dropped, with a one-line reason."""
    missing, doubled = [], []
    for section, classes in _declared().items():
        for key in uk.SECTIONS.get(section, {}):
            if all(key in fields for fields in classes):
                continue
            held = [name for name, table in ud.TABLES.items() if (section, key) in table]
            if not held:
                missing.append(f"{section}.{key}")
            elif len(held) > 1:
                doubled.append(f"{section}.{key}: {held}")
    assert not missing, f"upstream keys with no reason in upstream_dropped: {missing}"
    assert not doubled
    for table in ud.TABLES.values():
        for (section, key), why in table.items():
            assert why.strip() and "\n" not in why and len(why) <= 200, (section, key)


def test_no_reason_is_left_for_a_key_aitk_now_reads():
    """A key every schema class of its section declares acts: its entry must go (and a
    key the tables name must be one upstream has)."""
    declared = _declared()
    stale = [f"{s}.{k}" for table in ud.TABLES.values() for s, k in table
             if k not in uk.SECTIONS.get(s, {}) or
             all(k in fields for fields in declared.get(s, [set()]))]
    assert not stale, f"entries for keys aitk reads (or upstream lacks): {stale}"


def test_a_dropped_key_warns_with_its_reason():
    r = raw()
    proc(r)["train"]["learnable_snr_gos"] = True
    proc(r)["network"]["normalize"] = True
    assert parse(r).warnings == [
        "config.process[0].network.normalize: valid upstream but not acted on by "
        "aitk: " + ud.DROPPED[("network", "normalize")],
        "config.process[0].train.learnable_snr_gos: valid upstream but not acted on by "
        "aitk: " + ud.DROPPED[("train", "learnable_snr_gos")]]


# Issue 24's list of what aitk now trains as upstream does: (section, key, a value that
# switches it on).
TRAINED_NOW = [
    ("train", "diff_output_preservation", True), ("train", "blank_prompt_preservation", True),
    ("train", "ema_config", {"use_ema": True, "ema_decay": 0.9, "use_feedback": True,
                             "param_multiplier": 0.99}),
    ("train", "optimizer", "prodigy"), ("train", "loss_type", "wavelet"),
    ("train", "timestep_type", "lognorm_blend"), ("train", "content_or_style", "style"),
    ("train", "do_guidance_loss", True), ("train", "inverted_mask_prior", True),
    ("train", "validation_config", {"validation_items": [{"image_path": "x.png"}]}),
    ("datasets", "mask_path", "masks"), ("datasets", "alpha_mask", True),
    ("datasets", "augments", ["ColorJitter"]), ("datasets", "flip_x", True),
    ("datasets", "shuffle_tokens", True), ("datasets", "keep_tokens", 1),
    ("datasets", "token_dropout_rate", 0.2), ("datasets", "random_triggers", ["sks"]),
    ("datasets", "batch_size", 2), ("datasets", "is_reg", True),
    ("datasets", "prior_reg", True), ("datasets", "auto_frame_count", True),
    ("datasets", "replacements", ["red|crimson"]), ("datasets", "scale", 0.5),
    ("datasets", "square_crop", True), ("datasets", "random_crop", True),
    ("datasets", "random_scale", True), ("datasets", "network_weight", 0.5),
    ("network", "type", "dora"), ("network", "conv", 4), ("network", "conv_alpha", 4),
    ("logging", "use_wandb", True), ("save", "push_to_hub", True),
    ("train", "min_denoising_steps", 100), ("train", "max_denoising_steps", 800),
    ("train", "unet_lr", 5e-5), ("sample", "sample_start_step", 100),
    ("train", "max_loss", 0.5), ("train", "snr_gamma", 5.0),
    ("network", "pretrained_lora_path", "start.safetensors"),
    ("model", "lora_path", "fused.safetensors"),
    ("datasets", "audio_preserve_pitch", True),
]


def test_what_aitk_now_trains_warns_no_more():
    """Each switch issue 24 lists is read, none is in a not-acted-on table, and a config
    with all of them on (a dataset and a regularization dataset) loads without a
    warning."""
    assert not [(s, k) for s, k, _ in TRAINED_NOW for t in ud.TABLES.values() if (s, k) in t]
    r = raw()
    p = proc(r)
    p.setdefault("logging", {})
    for section, key, value in TRAINED_NOW:
        if section != "datasets" or key not in ("is_reg", "prior_reg"):
            (p["datasets"][0] if section == "datasets" else p[section])[key] = value
    p["datasets"].append({**p["datasets"][0], "is_reg": True, "prior_reg": True})
    p["save"]["hf_repo_id"] = "me/lora"
    assert parse(r).warnings == []
