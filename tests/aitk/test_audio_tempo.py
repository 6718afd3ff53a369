"""`datasets[].audio_preserve_pitch`: a soundtrack stretched or squeezed to its clip's
duration keeps its pitch (aitk.data.audio.tempo_stretch, FFmpeg's atempo through PyAV),
where the default linear stretch moves the pitch with the speed."""

from __future__ import annotations

import numpy as np
import pytest

from aitk.data.audio import ATEMPO_RANGE, AudioSpan, _atempo_chain, clip_span, fit, tempo_stretch

RATE = 16000


def tone(seconds: float, hz: float = 440.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return np.repeat((0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)[None], channels, 0)


def peak_hz(pcm: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(pcm[0] * np.hanning(pcm.shape[1])))
    return float(np.fft.rfftfreq(pcm.shape[1], 1 / RATE)[spectrum.argmax()])


@pytest.mark.parametrize("seconds", [1.5, 0.6, 3.0])
def test_a_stretch_keeps_the_pitch_and_the_exact_length(seconds: float) -> None:
    """One second of 440 Hz made 1.5 s (slower), 0.6 s (faster), 3 s (two atempo
    instances below 0.5): the peak stays at 440 Hz and the length is exact, where the
    linear stretch moves the peak to 440 / seconds."""
    src = tone(1.0, channels=2)
    samples = int(seconds * RATE)
    kept = tempo_stretch(src, RATE, samples)
    assert kept.shape == (2, samples) and kept.dtype == np.float32
    assert abs(peak_hz(kept) - 440) < 5
    assert np.abs(kept[:, samples // 4: 3 * samples // 4]).max() > 0.3  # sound, not silence
    moved = fit(src, samples, stretch=True)
    assert abs(peak_hz(moved) - 440 / seconds) < 10


def test_atempo_factors_stay_in_ffmpegs_range() -> None:
    low, high = ATEMPO_RANGE
    for tempo in (0.1, 0.3, 0.5, 0.9, 1.0, 2.0, 150.0):
        chain = _atempo_chain(tempo)
        assert all(low <= f <= high for f in chain)
        assert np.isclose(np.prod(chain), tempo)
    assert _atempo_chain(0.9) == [0.9]


def test_edge_lengths() -> None:
    src = tone(0.5)
    assert tempo_stretch(src, RATE, src.shape[1]) is not None
    assert np.array_equal(tempo_stretch(src, RATE, src.shape[1]), src)  # nothing to do
    assert tempo_stretch(src, RATE, 0).shape == (1, 0)
    assert tempo_stretch(src[:, :0], RATE, 100).tolist() == [[0.0] * 100]  # no sound: silence


def test_the_span_keeps_the_switch_only_where_it_stretches() -> None:
    assert clip_span((0, 1), 24.0, 12.0, trim=False, preserve_pitch=True) == AudioSpan(
        0.0, 2 / 24, 2 / 12, True, False, True)
    # real-time frames are cut, not stretched: the switch is dropped, the cache key kept
    assert clip_span((0, 1), 24.0, 12.0, trim=True, preserve_pitch=True) == clip_span(
        (0, 1), 24.0, 12.0, trim=True)
