"""The form and the YAML as two views of one config (aitk_server/form.py): every example
config survives form -> YAML -> form unchanged, an edit in the form changes exactly its
field in the YAML with every comment kept, and each field's kind, choices and bounds
are the trainer's schema's."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path

import pytest
import yaml

from aitk.config.schema import DatasetConfig, TrainConfig
from aitk_server import form

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "config" / "examples").glob("*.yaml"))
SPEC = {f["path"]: f for f in form.spec()}


def field_of(path: str) -> dict:
    """The spec entry of a concrete path (datasets[1] -> datasets[*])."""
    import re

    return SPEC[re.sub(r"datasets\[\d+\]", "datasets[*]", path)]


def comments(text: str) -> list[str]:
    return [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]


def other_value(path: str, value: object) -> object:
    """A different value of the same kind, inside the field's bounds."""
    f = field_of(path)
    kind = f["kind"]
    if kind == "bool":
        return not value
    if kind == "int":
        return value + 1
    if kind == "float":
        return value / 2 if value else 0.5
    if kind == "choice":
        return next(c for c in f["choices"] if c != value)
    if kind == "ints":
        first = value[0] if isinstance(value, list) else value
        return [first + 64, first + 128]
    if kind in ("lines",):
        return [*value, "[trigger] a new prompt, with: a colon"]
    if kind == "paths":  # as many folders: each one's comment stays with it
        return [f"{v}_changed" for v in value] if isinstance(value, list) else \
            f"{value}_changed"
    return f"{value}_changed"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_survives_form_to_yaml_to_form(example: Path) -> None:
    text = example.read_text(encoding="utf-8")
    shown = form.values(yaml.safe_load(text))
    assert shown["config.name"] and shown["config.process[0].train.steps"]
    edits = [{"path": p, "value": v} for p, v in shown.items()
             if p != "config.process[0].datasets"]
    again = form.apply(text, edits)
    assert again == text  # byte for byte: comments, quotes and flow lists kept
    assert form.values(yaml.safe_load(again)) == shown


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_each_field_edit_changes_its_line_and_keeps_every_comment(example: Path) -> None:
    text = example.read_text(encoding="utf-8")
    shown = form.values(yaml.safe_load(text))
    for path, value in shown.items():
        if path == "config.process[0].datasets" or value is None:
            continue
        new = other_value(path, value)
        edited = form.apply(text, [{"path": path, "value": new}])
        after = form.values(yaml.safe_load(edited))
        assert after[path] == new, path
        assert {p: v for p, v in after.items() if p != path} == \
            {p: v for p, v in shown.items() if p != path}, path
        assert comments(edited) == comments(text), path
        changed = [line for line in difflib.ndiff(text.splitlines(), edited.splitlines())
                   if line[:1] in "+-"]
        # A scalar changes one line; a list may grow by a line per new item.
        assert len(changed) <= 8, (path, changed)


def test_a_field_the_config_lacks_is_added_in_its_section() -> None:
    text = (REPO / "config" / "examples" / "train_lora_example_cpu.yaml").read_text()
    edited = form.apply(text, [
        {"path": "config.process[0].train.ema_config.use_ema", "value": True},
        {"path": "config.process[0].model.quantize", "value": True}])
    data = yaml.safe_load(edited)["config"]["process"][0]
    assert data["train"]["ema_config"] == {"use_ema": True}
    assert data["model"]["quantize"] is True
    assert comments(edited) == comments(text)


def test_lists_keep_their_style_and_items_can_be_added_and_removed() -> None:
    text = (REPO / "config" / "examples" / "train_lora_example_cpu.yaml").read_text()
    edited = form.apply(text, [
        {"path": "config.process[0].datasets[0].resolution", "value": [32, 48]},
        {"path": "config.process[0].datasets[1]",
         "value": {"folder_path": "datasets/more", "num_repeats": 2}}])
    assert "resolution: [32, 48]" in edited
    shown = form.values(yaml.safe_load(edited))
    assert shown["config.process[0].datasets"] == 2
    assert shown["config.process[0].datasets[1].num_repeats"] == 2
    back = form.apply(edited, [{"path": "config.process[0].datasets[1]", "remove": True}])
    assert form.values(yaml.safe_load(back))["config.process[0].datasets"] == 1


def test_prompts_of_a_samples_list_keep_each_items_other_keys() -> None:
    path = REPO / "config" / "examples" / "train_lora_qwen_image_edit_plus_tiny_cpu.yaml"
    text = path.read_text()
    edited = form.apply(text, [{"path": "config.process[0].sample.prompts",
                                "value": ["make the square blue", "a second one"]}])
    samples = yaml.safe_load(edited)["config"]["process"][0]["sample"]["samples"]
    assert samples[0]["prompt"] == "make the square blue"
    assert samples[0]["ctrl_img_2"].endswith("circle_to_red.png")
    assert samples[1] == {"prompt": "a second one"}
    assert "prompts" not in yaml.safe_load(edited)["config"]["process"][0]["sample"]


def test_a_quoted_string_stays_quoted() -> None:
    text = (REPO / "config" / "examples" / "train_lora_example_cpu.yaml").read_text()
    edited = form.apply(text, [{"path": "config.process[0].trigger_word", "value": "sks"}])
    assert 'trigger_word: "sks"' in edited


@pytest.mark.parametrize("edit", [
    {"path": "config.process[0].train.steps.deeper", "value": 1},
    {"path": "config.process[9].train.steps", "value": 1},
    {"path": "config..name", "value": "x"},
    {"path": "config.process[*].train.steps", "value": 1},
    {"value": 1},
])
def test_an_edit_the_config_cannot_take_is_one_error(edit: dict) -> None:
    text = (REPO / "config" / "examples" / "train_lora_example_cpu.yaml").read_text()
    with pytest.raises(form.EditError):
        form.apply(text, [edit])


def test_kinds_choices_and_bounds_are_the_schemas() -> None:
    optimizer = SPEC["config.process[0].train.optimizer"]
    assert optimizer["kind"] == "choice"
    assert optimizer["choices"] == typing.get_args(TrainConfig.model_fields["optimizer"]
                                                   .annotation)
    steps = SPEC["config.process[0].train.steps"]
    assert (steps["kind"], steps["minimum"], steps["default"]) == ("int", 1, 1000)
    lr = SPEC["config.process[0].train.lr"]
    assert (lr["kind"], lr["minimum"], lr["exclusive_minimum"]) == ("float", 0.0, True)
    res = SPEC["config.process[0].datasets[*].resolution"]
    assert (res["kind"], res["minimum"]) == ("ints", 1)
    dropout = SPEC["config.process[0].datasets[*].caption_dropout_rate"]
    assert (dropout["minimum"], dropout["maximum"]) == (0.0, 1.0)
    assert SPEC["config.process[0].datasets[*].caption_ext"]["default"] == \
        DatasetConfig.model_fields["caption_ext"].default


def test_every_arch_default_names_a_form_field() -> None:
    from aitk.models import catalog

    for desc in catalog.descriptions():
        view = form.arch_view(desc, {})
        for path in view["defaults_at"]:
            assert path in SPEC, (desc.name, path)
