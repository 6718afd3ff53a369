"""The new-job form and the YAML text as two views of one config.

The page holds the YAML text; the form is a view of it. `values(data)` reads each form
field from the parsed config (what is written, valid or not, so a wrong value shows at
its field); `apply(text, edits)` writes the form's changes into the text with
ruamel.yaml's round-trip mode, so every comment, quote style and flow list of the parts
not edited stays as it was (a value equal to the one written is not touched at all).
Field names are config paths (`config.process[0].train.steps`), the same paths the
schema and the preflight put on their problems, so a problem shows at its field.

What each field is (a whole number, a choice and its values, its bounds, its default)
is read from the trainer's schema (aitk.config.schema), never written down twice; this
module only chooses which fields the form shows, their labels and their groups. The
arch facts the form needs (capabilities, defaults) come from the arch descriptions
(aitk.models.catalog) through `arch_view`.

Only the first process of a job is shown in the form (a job with several is edited in
the YAML view). Dataset fields repeat per dataset: `datasets[*]` in a field's path
stands for each index.
"""

from __future__ import annotations

import io
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel

from aitk.config.schema import ProcessConfig

PROCESS = "config.process[0]"
ITEM = "[*]"  # in a field's path: every index of the list before it

# Which `when` a field carries decides whether the page shows it for the chosen arch:
#   control   the arch takes control (reference) images   (capabilities.control_images)
#   video     the arch trains on clips                       (capabilities.video)
#   flowmatch the arch's schedule reads timestep_type        (schedule == flowmatch)
#   quantize  shown while model.quantize is on
#   lokr      shown while network.type is lokr
#   preserve  shown while train.diff_output_preservation is on
#   ema       shown while train.ema_config.use_ema is on


@dataclass(frozen=True)
class Field:
    path: str  # the config path ("config.process[0].train.steps"); [*] = each item
    label: str
    group: str
    help: str = ""
    when: str = ""
    kind: str = ""  # filled from the schema unless set: int float bool text choice ints lines
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    exclusive_minimum: bool = False
    maximum: float | None = None
    default: Any = None


def _p(path: str) -> str:
    return f"{PROCESS}.{path}"


DS = f"{PROCESS}.datasets{ITEM}"

# The upstream form's common settings, in the order the page shows them.
LAYOUT: tuple[Field, ...] = (
    Field("config.name", "Job name", "Job", "names the output folder and the LoRA files",
          kind="text"),
    Field(_p("trigger_word"), "Trigger word", "Job", "a word the LoRA learns to answer "
          "to; [trigger] in captions and prompts becomes it (else it is prepended)"),
    Field(_p("model.arch"), "Model", "Model", kind="arch"),
    Field(_p("model.name_or_path"), "Weights", "Model", "a diffusers folder or a Hugging "
          "Face id (org/name)"),
    Field(_p("device"), "Device", "Model", "empty: the GPU when there is one, else cpu; "
          "cpu, cuda, cuda:N or mps"),
    Field(_p("model.quantize"), "Quantize the denoiser", "Memory", "less memory, a "
          "little slower; needs optimum-quanto"),
    Field(_p("model.qtype"), "Weight type", "Memory", when="quantize"),
    Field(_p("model.quantize_te"), "Quantize the text encoder", "Memory", when="quantize"),
    Field(_p("model.low_vram"), "Keep idle parts on the CPU", "Memory", "offloads the "
          "text encoder and VAE between uses"),
    Field(_p("train.gradient_checkpointing"), "Gradient checkpointing", "Memory",
          "less memory, about 30% slower"),
    Field(_p("train.cache_text_embeddings"), "Cache text embeddings", "Memory",
          "embed every caption once, then unload the text encoder"),
    Field(f"{DS}.folder_path", "Folder", "Datasets", kind="dataset"),
    Field(f"{DS}.num_repeats", "Repeats", "Datasets", "each picture counts this often"),
    Field(f"{DS}.resolution", "Resolutions", "Datasets", "sides in pixels, e.g. 512, "
          "768; pictures are bucketed by aspect"),
    Field(f"{DS}.caption_ext", "Caption extension", "Datasets"),
    Field(f"{DS}.caption_dropout_rate", "Caption dropout", "Datasets",
          "share of steps trained without the caption"),
    Field(f"{DS}.control_path", "Control folders", "Datasets", "the images to edit, one "
          "folder a line, paired with the targets by file name", when="control",
          kind="paths"),
    Field(f"{DS}.num_frames", "Frames per clip", "Datasets", "1 = still images", when="video"),
    Field(_p("network.type"), "Adapter", "Adapter"),
    Field(_p("network.linear"), "Rank", "Adapter", "the LoRA's size: 4-32 for a "
          "likeness or a style"),
    Field(_p("network.linear_alpha"), "Alpha", "Adapter", "scales the LoRA; usually the "
          "rank"),
    Field(_p("network.lokr_factor"), "LoKr factor", "Adapter", "-1: automatic", when="lokr"),
    Field(_p("train.steps"), "Steps", "Training"),
    Field(_p("train.batch_size"), "Batch size", "Training"),
    Field(_p("train.gradient_accumulation"), "Gradient accumulation", "Training"),
    Field(_p("train.lr"), "Learning rate", "Training"),
    Field(_p("train.optimizer"), "Optimizer", "Training", "adamw8bit needs bitsandbytes"),
    Field(_p("train.lr_scheduler"), "LR schedule", "Training"),
    Field(_p("train.timestep_type"), "Timesteps", "Training", when="flowmatch"),
    Field(_p("train.content_or_style"), "Timestep bias", "Training", when="flowmatch"),
    Field(_p("train.dtype"), "Training precision", "Training"),
    Field(_p("train.seed"), "Seed", "Training"),
    Field(_p("train.diff_output_preservation"), "Differential output preservation",
          "Preservation", "keeps what the class word draws without the trigger word"),
    Field(_p("train.diff_output_preservation_class"), "Class word", "Preservation",
          "e.g. person, dog, style", when="preserve"),
    Field(_p("train.diff_output_preservation_multiplier"), "Preservation strength",
          "Preservation", when="preserve"),
    Field(_p("train.blank_prompt_preservation"), "Blank prompt preservation",
          "Preservation", "keeps what the model draws for an empty prompt"),
    Field(_p("train.ema_config.use_ema"), "EMA of the adapter", "Preservation",
          "save and preview a moving average of the weights"),
    Field(_p("train.ema_config.ema_decay"), "EMA decay", "Preservation", when="ema"),
    Field(_p("sample.prompts"), "Preview prompts", "Previews", "one a line; [trigger] "
          "becomes the trigger word", kind="lines"),
    Field(_p("sample.sample_every"), "Preview every (steps)", "Previews"),
    Field(_p("sample.seed"), "Preview seed", "Previews"),
    Field(_p("sample.walk_seed"), "A new seed per prompt", "Previews"),
    Field(_p("sample.width"), "Width", "Previews"),
    Field(_p("sample.height"), "Height", "Previews"),
    Field(_p("sample.sample_steps"), "Sampling steps", "Previews"),
    Field(_p("sample.guidance_scale"), "Guidance scale", "Previews"),
    Field(_p("train.skip_first_sample"), "Skip the step-0 previews", "Previews"),
    Field(_p("train.disable_sampling"), "No previews", "Previews"),
    Field(_p("save.save_every"), "Save every (steps)", "Saving"),
    Field(_p("save.max_step_saves_to_keep"), "Step saves kept", "Saving"),
    Field(_p("save.dtype"), "LoRA precision", "Saving"),
)

# The arch description's `defaults` (aitk.models.description.Defaults) and the field
# each one fills in a new job.
DEFAULTS_AT = {"resolution": f"{DS}.resolution", "steps": _p("train.steps"),
               "rank": _p("network.linear"), "alpha": _p("network.linear_alpha"),
               "lr": _p("train.lr"), "timestep_type": _p("train.timestep_type"),
               "quantize": _p("model.quantize")}


# ---- paths ------------------------------------------------------------------------------
_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+|\*)\]")


def parse_path(path: str) -> list[str | int]:
    """"config.process[0].datasets[1].folder_path" -> ["config", "process", 0, ...];
    ValueError for anything that is not such a path."""
    parts: list[str | int] = []
    pos = 0
    for found in _TOKEN.finditer(path):
        if found.start() != pos and path[pos:found.start()] != ".":
            raise ValueError(f"not a config path: {path[:80]!r}")
        key, index = found.groups()
        parts.append(key if key is not None else (-1 if index == "*" else int(index)))
        pos = found.end()
    if pos != len(path) or not parts:
        raise ValueError(f"not a config path: {path[:80]!r}")
    return parts


def format_path(parts: Sequence[str | int]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


# ---- the schema's word on each field ------------------------------------------------------
def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """(the type, its constraints) with Annotated and `| None` taken off."""
    metadata: list[Any] = []
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation, *extra = typing.get_args(annotation)
            for item in extra:
                metadata += getattr(item, "metadata", None) or [item]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation, metadata
            annotation = args[0]
        else:
            return annotation, metadata


def _schema_field(parts: Sequence[str | int]) -> Any:
    """The pydantic FieldInfo at a process-relative path (list indices skipped)."""
    model: type[BaseModel] = ProcessConfig
    info = None
    for part in parts:
        if isinstance(part, int):
            continue
        info = model.model_fields[part]
        inner, _ = _unwrap(info.annotation)
        if typing.get_origin(inner) is list:
            inner, _ = _unwrap(typing.get_args(inner)[0])
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            model = inner
    return info


def _described(field: Field) -> Field:
    """The field with its kind, choices, bounds and default from the schema."""
    parts = parse_path(field.path)
    if parts[:3] != ["config", "process", 0]:
        return field if field.kind else Field(**{**asdict(field), "kind": "text"})
    info = _schema_field(parts[3:])
    inner, metadata = _unwrap(info.annotation)
    metadata = [*info.metadata, *metadata]  # pydantic keeps a field's own constraints there
    kind, choices = field.kind, ()
    if typing.get_origin(inner) is typing.Literal:
        choices = tuple(str(c) for c in typing.get_args(inner) if isinstance(c, str))
        kind = kind or "choice"
    elif typing.get_origin(inner) in (typing.Union, types.UnionType):
        kind = kind or "ints"  # `resolution`: one side or a list of them
        for arg in typing.get_args(inner):
            single, constraints = _unwrap(arg)
            if single is int:
                metadata += constraints
    elif typing.get_origin(inner) is list:
        kind = kind or "lines"
    else:
        kind = kind or {bool: "bool", int: "int", float: "float"}.get(inner, "text")
    bounds = {"minimum": None, "exclusive_minimum": False, "maximum": None}
    for item in metadata:
        for name, key, exclusive in (("ge", "minimum", False), ("gt", "minimum", True),
                                     ("le", "maximum", False)):
            if getattr(item, name, None) is not None:
                bounds[key] = getattr(item, name)
                if key == "minimum":
                    bounds["exclusive_minimum"] = exclusive
    default = info.default if not info.is_required() else None
    if isinstance(default, tuple | list):
        default = list(default)
    elif not isinstance(default, str | int | float | bool | type(None)):
        default = None
    return Field(**{**asdict(field), "kind": kind, "choices": choices, "default": default,
                    **bounds})


def spec() -> list[dict[str, Any]]:
    """Every field the form shows, as the page draws it."""
    return [asdict(_described(f)) for f in LAYOUT]


# ---- reading ---------------------------------------------------------------------------
def _walk(data: Any, parts: Sequence[str | int]) -> Iterator[tuple[list[str | int], Any]]:
    """(concrete path, value) of every value at `parts` (-1 = each item); missing ones
    are left out."""
    if not parts:
        yield [], data
        return
    head, rest = parts[0], parts[1:]
    if head == -1:
        for i, item in enumerate(data if isinstance(data, list) else []):
            for sub, value in _walk(item, rest):
                yield [i, *sub], value
    elif isinstance(head, int):
        if isinstance(data, list) and head < len(data):
            for sub, value in _walk(data[head], rest):
                yield [head, *sub], value
    elif isinstance(data, Mapping) and head in data:
        for sub, value in _walk(data[head], rest):
            yield [head, *sub], value


def _plain(value: Any) -> Any:
    """ruamel's scalars and containers as plain JSON values."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def _prompts(sample: Any) -> list[Any] | None:
    """The preview prompts, from `samples` (each item's prompt) when it is written, else
    from the legacy `prompts` list (the trainer reads them in that order too)."""
    if not isinstance(sample, Mapping):
        return None
    if isinstance(sample.get("samples"), list):
        return [item.get("prompt") if isinstance(item, Mapping) else item
                for item in sample["samples"]]
    return sample.get("prompts") if isinstance(sample.get("prompts"), list) else None


def values(data: Any) -> dict[str, Any]:
    """Every form field's written value by its concrete path (absent fields left out)."""
    out: dict[str, Any] = {}
    for field in LAYOUT:
        parts = parse_path(field.path)
        if field.path == _p("sample.prompts"):
            found = [(parts[:-1], s) for _, s in _walk(data, parts[:-1])]
            for where, sample in found:
                prompts = _prompts(sample)
                if prompts is not None:
                    out[format_path([*where, "prompts"])] = _plain(prompts)
            continue
        for where, value in _walk(data, parts):
            out[format_path(where)] = _plain(value)
    for where, items in _walk(data, parse_path(f"{PROCESS}.datasets")):
        out[format_path(where)] = len(items) if isinstance(items, list) else 0
    return out


# ---- writing ---------------------------------------------------------------------------
def _yaml() -> Any:
    from ruamel.yaml import YAML

    yaml = YAML()  # round-trip: comments, quotes, key order and flow lists kept
    yaml.preserve_quotes = True
    yaml.width = 1 << 20  # never fold a long line the user wrote on one
    # The shipped examples' layout: maps by 2, list dashes indented 2 inside 4.
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.representer.add_representer(float, _represent_float)
    return yaml


def _represent_float(representer: Any, value: float) -> Any:
    """A float the trainer's loader reads as a float: PyYAML follows YAML 1.1, where
    `5e-05` (no dot) is a string, so the mantissa always gets one (`5.0e-05`)."""
    if value != value:
        text = ".nan"
    elif value in (float("inf"), float("-inf")):
        text = ".inf" if value > 0 else "-.inf"
    else:
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if e and "." not in mantissa:
            text = f"{mantissa}.0e{exponent}"
    return representer.represent_scalar("tag:yaml.org,2002:float", text)


class EditError(ValueError):
    """An edit the config's shape cannot take (a path through a value that is not a
    mapping or a list, an index past the end); the message names the path."""


def _same(old: Any, new: Any) -> bool:
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is type(new) and old == new
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(_same(a, b) for a, b in zip(old, new, strict=True))
    return old == new and (old is None) == (new is None)


def _new_value(old: Any, new: Any) -> Any:
    """`new` in the style `old` was written in: a quoted string stays quoted, a flow
    list stays a flow list (edited in place)."""
    from ruamel.yaml.comments import CommentedSeq
    from ruamel.yaml.scalarstring import ScalarString

    if isinstance(old, ScalarString) and isinstance(new, str):
        return type(old)(new)
    if isinstance(old, CommentedSeq) and isinstance(new, list) and not any(
            isinstance(v, dict | list) for v in new):
        _assign_items(old, new)
        return old
    if isinstance(new, list) and not isinstance(old, list) and all(
            isinstance(v, int | float) for v in new):
        seq = CommentedSeq(new)
        seq.fa.set_flow_style()  # `resolution: [512, 768]`, as upstream writes it
        return seq
    return new


def _assign_items(old: list[Any], new: list[Any]) -> None:
    """A list edited item by item, so each kept item keeps its comment and quotes."""
    for i, value in enumerate(new[:len(old)]):
        if not _same(old[i], value):
            old[i] = _new_value(old[i], value)
    del old[len(new):]
    old.extend(new[len(old):])


def _container(node: Any, key: str | int, path: str, next_key: str | int) -> Any:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(key, int):
        if not isinstance(node, list) or key > len(node):
            raise EditError(f"{path}: no such item")
        if key == len(node):
            node.append(CommentedMap() if isinstance(next_key, str) else CommentedSeq())
        return node[key]
    if not isinstance(node, Mapping):
        raise EditError(f"{path}: not a section with keys")
    if node.get(key) is None:
        node[key] = CommentedMap() if isinstance(next_key, str) else CommentedSeq()
    return node[key]


def _set(doc: Any, parts: list[str | int], value: Any) -> None:
    node = doc
    for i, key in enumerate(parts[:-1]):
        node = _container(node, key, format_path(parts[:i + 1]), parts[i + 1])
    last, where = parts[-1], format_path(parts)
    if isinstance(last, int):
        if not isinstance(node, list) or last > len(node):
            raise EditError(f"{where}: no such item")
        if last == len(node):
            node.append(value)
        elif not _same(node[last], value):
            node[last] = _new_value(node[last], value)
        return
    if not isinstance(node, Mapping):
        raise EditError(f"{where}: its section is not a mapping")
    if value is None:
        node.pop(last, None)
    elif last not in node:
        node[last] = _new_value(None, value)
    elif not _same(node[last], value):
        node[last] = _new_value(node[last], value)


def _set_prompts(doc: Any, parts: list[str | int], prompts: Any) -> None:
    """The preview prompts into `samples` when the config lists them there (each item's
    other keys kept), else into `prompts`."""
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise EditError(f"{format_path(parts)}: a list of prompts (text)")
    sample = next((s for _, s in _walk(doc, parts[:-1])), None)
    if isinstance(sample, Mapping) and isinstance(sample.get("samples"), list):
        items = sample["samples"]
        del items[len(prompts):]
        for i, prompt in enumerate(prompts):
            if i < len(items) and isinstance(items[i], Mapping):
                _set(items[i], ["prompt"], prompt)
            elif i >= len(items):
                from ruamel.yaml.comments import CommentedMap

                items.append(CommentedMap(prompt=prompt))
        return
    current = sample.get("prompts") if isinstance(sample, Mapping) else None
    if isinstance(current, list):
        _assign_items(current, prompts)
    else:
        _set(doc, parts, prompts)


def apply(text: str, edits: Sequence[Mapping[str, Any]]) -> str:
    """The YAML `text` with each edit made: {"path", "value"} sets a value (None deletes
    the key; an index one past a list's end appends), {"path", "remove": true} deletes
    a key or a list item. The text must have passed the bounded loader first
    (configs.load_yaml): no aliases, bounded size and depth. EditError for an edit the
    config's shape cannot take."""
    yaml = _yaml()
    doc = yaml.load(text)
    if doc is None:
        from ruamel.yaml.comments import CommentedMap

        doc = CommentedMap()
    for edit in edits:
        path = edit.get("path")
        if not isinstance(path, str):
            raise EditError("each edit names its field: {\"path\": ..., \"value\": ...}")
        try:
            parts = parse_path(path)
        except ValueError as exc:
            raise EditError(str(exc)) from None
        if -1 in parts:
            raise EditError(f"{path}: name one item, not [*]")
        if edit.get("remove"):
            _remove(doc, parts)
        elif path.endswith(".sample.prompts"):
            _set_prompts(doc, parts, edit.get("value"))
        else:
            _set(doc, parts, edit.get("value"))
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue()


def _remove(doc: Any, parts: list[str | int]) -> None:
    parent = next((v for _, v in _walk(doc, parts[:-1])), None)
    last = parts[-1]
    if isinstance(last, int) and isinstance(parent, list) and last < len(parent):
        del parent[last]
    elif isinstance(last, str) and isinstance(parent, Mapping):
        parent.pop(last, None)


# ---- the arch picker -----------------------------------------------------------------------
def arch_view(desc: Any, examples: Mapping[str, str]) -> dict[str, Any]:
    """One arch description as the picker shows it; `examples`: the example files
    present (name -> text) of which this arch's are offered."""
    caps = desc.capabilities
    defaults = asdict(desc.defaults) if desc.defaults is not None else None
    if defaults is not None:
        defaults["resolution"] = list(defaults["resolution"])
    shipped = {kind: name for kind, name in (("tiny", desc.examples.tiny),
                                             ("full", desc.examples.full))
               if name and name.rsplit(".", 1)[0] in examples}
    return {
        "name": desc.name, "aliases": list(desc.aliases), "summary": desc.summary,
        "size_multiple": desc.size_multiple,
        "schedule": desc.schedule.kind if desc.schedule else None,
        "video": str(caps.video) if caps and caps.video else None,
        "control_images": caps.control_images if caps else 0,
        "first_frame": bool(caps and caps.first_frame),
        "experts": list(caps.experts) if caps else [],
        "defaults": defaults,
        "defaults_at": {DEFAULTS_AT[k]: v for k, v in (defaults or {}).items()
                        if k in DEFAULTS_AT and v is not None},
        "examples": shipped,
        "variants": [{"tag": v.tag, "summary": v.summary, "params": v.params}
                     for v in desc.variants],
    }
