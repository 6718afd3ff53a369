"""A video clip's soundtrack for the archs that train sound (`datasets[].do_audio`).

Decoder: PyAV, the same FFmpeg libraries (bundled in the `av` wheel, hash-checked by the
installer) that decode the clip's frames in aitk.data.video, reading the same bounded,
already opened file object; FFmpeg's resampler (swresample) converts the first audio
stream to float PCM at the arch's sample rate and channel count. A file without an
audio stream gives None: the clip trains video only (one line in the log, never an
error).

Which samples a clip takes (upstream's rule, `AudioSpan`): the source time of its chosen
frames, from the first one to the end of the last one, fitted to the clip's training
duration (its frame count at the dataset's `fps`). With `auto_frame_count` and
`trim_auto_frame_count_tail` the frames are real time, so the samples are cut (or padded
with silence) to that duration; otherwise they are stretched or squeezed linearly (the
pitch moves with the speed, as upstream does by default), or, with `audio_preserve_pitch`,
by FFmpeg's `atempo` filter (`tempo_stretch`), which changes the speed and keeps the
pitch, as upstream's phase vocoder does. `audio_normalize` (upstream's key) scales the
track, as far as it is decoded, so its peak is 0.999.

`log_mel` is the log-magnitude mel spectrogram LTX-2's audio VAE reads (Slaney mel scale
and filter norm, a periodic Hann window of n_fft samples, centred frames with reflection
padding, log of max(x, 1e-5)), computed with torch.stft and transformers' filter bank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import torch

from aitk.errors import UnreadableVideo

MAX_AUDIO_SECONDS = 15 * 60  # decoded at most this far into a file


@dataclass(frozen=True)
class AudioSpan:
    """The soundtrack of one clip: source seconds [start, end) -> `duration` seconds."""

    start: float
    end: float
    duration: float
    stretch: bool = True  # False: cut or pad to the duration (real-time frames)
    normalize: bool = False  # audio_normalize: the decoded track's peak scaled to 0.999
    preserve_pitch: bool = False  # audio_preserve_pitch: a stretch keeps the pitch


def clip_span(frames: tuple[int, ...], video_fps: float | None, fps: float,
              trim: bool, normalize: bool = False, preserve_pitch: bool = False
              ) -> AudioSpan | None:
    """The span of a clip's chosen `frames` of a video at `video_fps`, trained as
    len(frames) frames at `fps`; None when the video does not say its rate.
    `preserve_pitch` only matters for a stretched span, so a trimmed one drops it (and
    keeps the cache key of the same sound)."""
    if not video_fps or not frames:
        return None
    start, end = frames[0] / video_fps, (frames[-1] + 1) / video_fps
    return AudioSpan(start, end, len(frames) / fps, not trim, normalize,
                     preserve_pitch and not trim)


def _decoded(fh: BinaryIO, sample_rate: int, channels: int, until: float
             ) -> np.ndarray | None:
    """(channels, samples) float32 from time 0 of the first audio stream up to `until`
    seconds; None without an audio stream."""
    import av

    layout = "mono" if channels == 1 else "stereo"
    with av.open(fh, mode="r") as container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="fltp", layout=layout, rate=sample_rate)
        chunks: list[np.ndarray] = []
        lead = None  # the stream's first timestamp: a late start is silence before it
        wanted = int(min(until, MAX_AUDIO_SECONDS) * sample_rate) + 1
        have = 0
        for frame in container.decode(stream):
            if lead is None:
                lead = max(0.0, float(frame.time or 0.0))
                pad = int(round(lead * sample_rate))
                if pad:
                    chunks.append(np.zeros((channels, pad), np.float32))
                    have += pad
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray().reshape(channels, -1))
                have += chunks[-1].shape[1]
            if have >= wanted:
                break
        for out in resampler.resample(None):
            chunks.append(out.to_ndarray().reshape(channels, -1))
    if not chunks:
        return np.zeros((channels, 0), np.float32)
    return np.concatenate(chunks, axis=1).astype(np.float32)


def fit(pcm: np.ndarray, samples: int, stretch: bool) -> np.ndarray:
    """`pcm` (C, N) made `samples` long: linear resampling in time when `stretch`, else
    cut or padded with silence at the end."""
    if pcm.shape[1] == samples:
        return pcm
    if not stretch or pcm.shape[1] < 2:
        out = np.zeros((pcm.shape[0], samples), np.float32)
        n = min(samples, pcm.shape[1])
        out[:, :n] = pcm[:, :n]
        return out
    # sample i of the output sits at (i + 1/2) * N / samples - 1/2 of the input
    # (align_corners=False, as torch's linear interpolation)
    where = (np.arange(samples) + 0.5) * pcm.shape[1] / samples - 0.5
    where = np.clip(where, 0, pcm.shape[1] - 1)
    base = np.arange(pcm.shape[1])
    return np.stack([np.interp(where, base, ch) for ch in pcm]).astype(np.float32)


ATEMPO_RANGE = (0.5, 100.0)  # one atempo instance's tempo factor (FFmpeg's bounds)


def _atempo_chain(tempo: float) -> list[float]:
    """Factors within ATEMPO_RANGE whose product is `tempo` (FFmpeg chains instances
    for a larger change)."""
    low, high = ATEMPO_RANGE
    factors = []
    while tempo < low or tempo > high:
        step = low if tempo < low else high
        factors.append(step)
        tempo /= step
    return factors + [tempo]


def tempo_stretch(pcm: np.ndarray, sample_rate: int, samples: int) -> np.ndarray:
    """`pcm` (C, N) played at the speed that makes it `samples` long, its pitch kept:
    FFmpeg's atempo filter (WSOLA) through PyAV's filter graph; the last few
    milliseconds the filter's window leaves are cut or padded with silence."""
    from fractions import Fraction

    import av
    import av.filter

    if pcm.shape[1] == samples or pcm.shape[1] == 0 or samples <= 0:
        return fit(pcm, max(samples, 0), stretch=False)
    layout = "mono" if pcm.shape[0] == 1 else "stereo"
    graph = av.filter.Graph()
    chain = [graph.add_abuffer(format="fltp", sample_rate=sample_rate, layout=layout,
                               time_base=Fraction(1, sample_rate))]
    for factor in _atempo_chain(pcm.shape[1] / samples):
        chain.append(graph.add("atempo", f"{factor:.9f}"))
    chain.append(graph.add("abuffersink"))
    for a, b in zip(chain, chain[1:], strict=False):
        a.link_to(b)
    graph.configure()
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm, np.float32),
                                       format="fltp", layout=layout)
    frame.sample_rate, frame.pts, frame.time_base = sample_rate, 0, Fraction(1, sample_rate)
    graph.push(frame)
    graph.push(None)
    out: list[np.ndarray] = []
    while True:
        try:
            got = graph.pull()
        except (av.BlockingIOError, av.EOFError):
            break
        data = got.to_ndarray()  # atempo may answer packed (interleaved) samples
        out.append(data.reshape(pcm.shape[0], -1) if got.format.is_planar
                   else data.reshape(-1, pcm.shape[0]).T)
    stretched = (np.concatenate(out, axis=1) if out
                 else np.zeros((pcm.shape[0], 0), np.float32))
    return fit(stretched.astype(np.float32), samples, stretch=False)


def read_audio(fh: BinaryIO, span: AudioSpan, sample_rate: int, channels: int
               ) -> np.ndarray | None:
    """The clip's soundtrack, (channels, round(duration * sample_rate)) float32 in
    [-1, 1]; None when the file has no audio stream. UnreadableVideo when FFmpeg cannot
    decode it."""
    import av

    try:
        pcm = _decoded(fh, sample_rate, channels, span.end)
    except (av.FFmpegError, ValueError, EOFError) as exc:
        raise UnreadableVideo(f"its audio cannot be decoded ({exc})") from None
    if pcm is None:
        return None
    if span.normalize and pcm.size:
        # upstream's audio_normalize: one gain for the whole track (here: as far as it
        # is decoded, up to the clip's end), its peak to 0.999 (~ -0.01 dBFS)
        pcm = pcm * (0.999 / (float(np.abs(pcm).max()) + 1e-9))
    a, b = int(round(span.start * sample_rate)), int(round(span.end * sample_rate))
    piece = pcm[:, a:b]
    if piece.shape[1] < b - a:  # the soundtrack ends before the frames: silence after it
        piece = fit(piece, b - a, stretch=False)
    samples = int(round(span.duration * sample_rate))
    if span.stretch and span.preserve_pitch:
        return tempo_stretch(piece, sample_rate, samples)
    return fit(piece, samples, span.stretch)


def log_mel(pcm: torch.Tensor, sample_rate: int, hop: int, mel_bins: int,
            n_fft: int = 1024) -> torch.Tensor:
    """(C, N) waveform -> (C, frames, mel_bins) log-magnitude mel spectrogram, frames =
    N // hop + 1 (centred)."""
    from transformers.audio_utils import mel_filter_bank

    filters = torch.from_numpy(mel_filter_bank(
        num_frequency_bins=n_fft // 2 + 1, num_mel_filters=mel_bins, min_frequency=0.0,
        max_frequency=sample_rate / 2.0, sampling_rate=sample_rate, norm="slaney",
        mel_scale="slaney")).to(pcm.device, torch.float32)
    spec = torch.stft(pcm.float(), n_fft=n_fft, hop_length=hop, win_length=n_fft,
                      window=torch.hann_window(n_fft, device=pcm.device), center=True,
                      pad_mode="reflect", return_complex=True).abs()  # (C, freq, frames)
    mel = torch.einsum("cft,fm->ctm", spec, filters)
    return torch.log(mel.clamp(min=1e-5))
