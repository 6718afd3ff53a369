"""The encoded inputs of a process: latents and text embeddings, computed once before
the loop (in memory, and on disk under AITK_CACHE_DIR when the datasets ask for it) or
per batch when nothing asks for caching.

Cache keys cover the input's content and the model's identity (aitk.data.cache); on a
disk cache shared by several ranks each rank fills its own share first.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from aitk.config.loading import REPO_ROOT
from aitk.config.schema import TrainingProcess
from aitk.data import controls
from aitk.data.cache import AudioOf, ItemAudio, LatentCache, TextEmbedCache, default_cache_dir
from aitk.data.captions import embed_blanked
from aitk.data.dataset import Item
from aitk.run import distributed
from aitk.run.signals import StopFlag


@dataclass
class Inputs:
    """How the batch source gets each batch's latents and embeddings, and the preview
    prompts' embeddings (None: the previews embed their prompts themselves)."""

    latents: Callable[[Sequence[Item]], torch.Tensor] | None  # None: encode each batch
    embeds: Callable[..., Any]
    control_embeds: controls.ControlEmbeds | None
    sample_embeds: dict[str, Any] | None
    # Prompts embedded once before the text encoder may go (the validation prompts).
    prompt_embeds: dict[str, Any] = field(default_factory=dict)
    # False when text embeddings are cached once per caption: the per-draw caption
    # changes (aitk.data.captions) are then off, as upstream's cached embeddings are.
    vary_captions: bool = True
    # Archs that train sound (`do_audio`): an item's audio latents (cached with its
    # latents when those are); None: no item has sound to read.
    audio: AudioOf | None = None

    def reembed(self, captions: list[str], batch: Any, blanks: Any = None) -> Any:
        """A batch's embeddings for other captions (a preservation prompt), from the same
        cache as its own; with its controls for a model whose embeddings read them.
        `blanks`: train.prompt_dropout_prob's draw for these captions (only drawn when
        they are embedded live), as for the batch's own (aitk.data.batches)."""
        control_embeds = self.control_embeds
        return embed_blanked(
            captions, blanks, self.embeds,
            None if control_embeds is None or batch.control_tensor_list is None else
            lambda texts: control_embeds(texts, batch.items, batch.control_tensor_list))


def caches_text(proc: TrainingProcess) -> bool:
    tr = proc.train
    return tr.cache_text_embeddings or tr.unload_text_encoder or \
        any(ds.cache_text_embeddings for ds in proc.datasets)


def caption_changes_off(proc: TrainingProcess, say: Callable[[str], None]) -> bool:
    """Whether caption changes are dropped for cached text embeddings (said once)."""
    if not caches_text(proc):
        return False
    for i, ds in enumerate(proc.datasets):
        changing = [k for k, on in (("shuffle_tokens", ds.shuffle_tokens),
                                    ("token_dropout_rate", ds.token_dropout_rate > 0),
                                    ("random_triggers", bool(ds.random_triggers))) if on]
        if changing:
            say(f"datasets[{i}]: {', '.join(changing)} change the caption at every draw, "
                "but text embeddings are cached once per caption: not applied (turn off "
                "cache_text_embeddings/unload_text_encoder to use them)")
    return True


def live_prompt_dropout(proc: TrainingProcess) -> float:
    """train.prompt_dropout_prob where it acts: on prompts embedded live; 0 with text
    embeddings cached (as upstream, `prompt_dropout_off` says so)."""
    return 0.0 if caches_text(proc) else proc.train.prompt_dropout_prob


def prompt_dropout_off(proc: TrainingProcess, say: Callable[[str], None]) -> None:
    """Say (once) that train.prompt_dropout_prob does not act on cached embeddings."""
    p = proc.train.prompt_dropout_prob
    if p > 0 and caches_text(proc):
        say(f"train.prompt_dropout_prob ({p:g}) blanks prompts only when they are "
            "embedded live, and text embeddings are cached: not applied (turn off "
            "cache_text_embeddings/unload_text_encoder to use it; "
            "datasets[].caption_dropout_rate blanks cached captions)")


def encode_inputs(proc: TrainingProcess, model: Any, items: list[Item], samples: list[Any],
                  stop: StopFlag, say: Callable[[str], None], stream: TextIO,
                  world: distributed.World = distributed.SINGLE,
                  extra: Callable[[Item], list[str]] = lambda item: [],
                  prompts: Sequence[str] = ()) -> Inputs:
    """Fill the caches the config asks for; a model whose embeddings read the control
    images (edit models) embeds each caption with its item's controls. `extra`: the
    other captions the objective embeds for an item (aitk.run.objectives.extra_captions),
    cached with its own; `prompts`: embedded once, without controls, before anything
    unloads the text encoder."""
    fixed = model.encode_prompts(prompts) if prompts else {}
    cache_dir = usable_cache_dir(say)
    audio: AudioOf | None = ItemAudio(model, say) \
        if any(i.audio is not None for i in items) else None
    latents, audio = cached_latents(proc, model, items, stop, say, stream, cache_dir, world,
                                    audio)
    vary = not caption_changes_off(proc, say)
    prompt_dropout_off(proc, say)
    if model.encode_control_in_text_embeddings and items and items[0].controls:
        control_embeds, sample_embeds = control_text_embeddings(
            proc, model, items, samples, stop, say, cache_dir, world, extra)
        # unused: every item has its controls
        return Inputs(latents, model.get_prompt_embeds, control_embeds, sample_embeds, fixed,
                      vary, audio)
    embeds, sample_embeds = text_embeddings(proc, model, items, samples, stop, say,
                                            cache_dir, world, extra)
    return Inputs(latents, embeds, None, sample_embeds, fixed, vary, audio)


def usable_cache_dir(say: Callable[[str], None]) -> Path | None:
    """The cache folder, or None when it cannot be written (a read-only checkout): the
    caches then live in memory for this run. Never a reason to stop training."""
    folder = default_cache_dir(REPO_ROOT)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        say(f"cache folder {folder} is not writable ({exc.strerror or exc}); caches stay "
            "in memory for this run (set AITK_CACHE_DIR to a writable folder)")
        return None
    return folder


def model_identity(model: Any, cache_dir: Path | None) -> str:
    """The model's cache-key fingerprint. File digests are remembered in the cache folder
    (by path, size and mtime), so a multi-GB model is hashed once, not at every start."""
    return model.identity(digest_cache=cache_dir / "model_digests.json" if cache_dir
                          else None)


def fill_shared(fill: Callable[..., Any], entries: Sequence[Any], world: distributed.World,
                shared: bool, stop: StopFlag) -> None:
    """Fill a cache. On a disk cache shared by several ranks, each rank first computes
    its own share (every W-th entry), so no two ranks write one entry; after a barrier
    the full pass only reads what the others wrote."""
    if shared and world.distributed:
        fill(list(dict.fromkeys(entries))[world.rank::world.size], stop=stop.check)
        distributed.barrier(world)
    fill(entries, stop=stop.check)


def cached_latents(proc: TrainingProcess, model: Any, items: list[Item], stop: StopFlag,
                   say: Callable[[str], None], stream: TextIO, cache_dir: Path | None,
                   world: distributed.World = distributed.SINGLE,
                   audio: AudioOf | None = None
                   ) -> tuple[Callable[[Sequence[Item]], torch.Tensor] | None, AudioOf | None]:
    """Encode every image once (memory, and disk with `cache_latents_to_disk`), and
    with `audio` each clip's sound beside it: (batch latents, item audio); (None,
    `audio`) when no dataset asks for caching: the loop then encodes each batch."""
    if not any(ds.cache_latents or ds.cache_latents_to_disk for ds in proc.datasets):
        return None, audio
    for i, ds in enumerate(proc.datasets):
        if ds.random_pixels:  # aitk.data.batches encodes these batches from the pixels
            what = "augments" if ds.augments else \
                "random_scale" if ds.random_scale else "random_crop"
            say(f"datasets[{i}].{what} change the pixels at every draw: its latents are "
                "encoded per batch, not cached")
    items = [i for i in items if not proc.datasets[i.dataset].random_pixels]
    to_disk = any(ds.cache_latents_to_disk for ds in proc.datasets)
    folder = cache_dir / "latents" if to_disk and cache_dir else None
    cache = LatentCache(model.encode_images, model_identity(model, cache_dir),
                        model.latent_space_version, folder, report=say, audio=audio)
    print(f"caching latents for {len(set(items))} image sizes", file=stream, flush=True)
    fill_shared(cache.fill, items, world, folder is not None, stop)
    return cache.get, (cache.audio_of if audio is not None else None)


def text_embeddings(proc: TrainingProcess, model: Any, items: list[Item],
                    samples: list[Any], stop: StopFlag, say: Callable[[str], None],
                    cache_dir: Path | None, world: distributed.World = distributed.SINGLE,
                    extra: Callable[[Item], list[str]] = lambda item: []
                    ) -> tuple[Callable[[list[str]], Any], dict[str, Any] | None]:
    """(captions -> batch embeds, embeds for the preview prompts or None).

    With `cache_text_embeddings` (or `unload_text_encoder`), every caption the run can
    use (the empty one for caption dropout, the preview prompts, each item's `extra`
    captions) is embedded up front and the text encoder is unloaded; otherwise captions
    are embedded per batch (with their graph while a text encoder's LoRA trains: the
    schema refuses caching with it). Entries are keyed by caption text, so a
    preservation caption follows its class word."""
    tr = proc.train
    wanted = tr.cache_text_embeddings or tr.unload_text_encoder
    def live(captions: list[str], blanks: Any = None) -> Any:
        """train.prompt_dropout_prob's `blanks` (aitk.data.captions.dropped_prompts) go
        to the model, which blanks each row's prompt as its arch does."""
        if blanks is None:
            return model.get_prompt_embeds(captions)
        return model.get_prompt_embeds_dropped(captions, blanks)

    if getattr(model, "text_encoder_trains", False):
        return live, None  # with gradients: a full fine-tune trains it
    if not (wanted or any(ds.cache_text_embeddings for ds in proc.datasets)):
        def embed(captions: list[str], blanks: Any = None) -> Any:
            if model.text_encoder_trains:  # the text encoders' LoRA learns from this loss
                return live(captions, blanks)
            with torch.no_grad():
                return live(captions, blanks).detach()

        return embed, None
    captions = [i.caption for i in items]
    if any(i.caption_dropout_rate > 0 for i in items):
        captions.append("")
    captions += [c for i in items for c in extra(i)]
    captions += [t for c in samples for t in (c.prompt, c.negative_prompt)]
    cache = TextEmbedCache(model.encode_prompts, model_identity(model, cache_dir),
                           model.text_embedding_space_version,
                           cache_dir / "text_embeds" if cache_dir else None, report=say)
    fill_shared(cache.fill, list(dict.fromkeys(captions)), world, cache_dir is not None,
                stop)
    model.unload_text_encoder()  # every caption is cached: free its memory
    return cache.get, cache.mapping()


def control_text_embeddings(proc: TrainingProcess, model: Any, items: list[Item],
                            samples: list[Any], stop: StopFlag, say: Callable[[str], None],
                            cache_dir: Path | None,
                            world: distributed.World = distributed.SINGLE,
                            extra: Callable[[Item], list[str]] = lambda item: []
                            ) -> tuple[controls.ControlEmbeds, dict[str, Any] | None]:
    """`text_embeddings` for a model whose embeddings read the control images
    (aitk.data.controls): cache entries are keyed by caption and control content, and the
    preview prompts by `prompt_key(text, ctrl_imgs)`."""
    def encode(captions: list[str], images: list[torch.Tensor]) -> Any:
        with torch.no_grad():
            return model.get_prompt_embeds(captions, control_images=images).detach()

    tr = proc.train
    if not (tr.cache_text_embeddings or tr.unload_text_encoder
            or any(ds.cache_text_embeddings for ds in proc.datasets)):
        return (lambda captions, batch_items, images: encode(captions, images)), None
    cache = controls.ControlTextEmbedCache(
        encode, model_identity(model, cache_dir), model.text_embedding_space_version,
        cache_dir / "text_embeds" if cache_dir else None, report=say)
    pairs = controls.caption_pairs(items) + [(c, i) for i in items for c in extra(i)]
    fill_shared(cache.fill, pairs, world, cache_dir is not None, stop)
    sample_embeds = {}
    for c in samples:
        images = controls.load_sample_controls(c.ctrl_imgs)
        for text in (c.prompt, c.negative_prompt):
            sample_embeds[controls.prompt_key(text, c.ctrl_imgs)] = encode([text], images)
    model.unload_text_encoder()  # every caption is cached: free its memory
    return (lambda captions, batch_items, images: cache.get(captions, batch_items)), \
        sample_embeds
