"""Captioning a dataset folder with a vision-language model (`python -m aitk caption`).

    settings.py   CaptionSettings: what one run was asked to do (plain data)
    selection.py  which files get a caption: a scan into facts, then a pure decision
    media.py      the picture a file shows (an image, or a video's first frame)
    vlm.py        the model: loading a Qwen-VL folder or hub id through transformers,
                  one caption per picture
    writer.py     the caption text (trigger prefix) and its atomic write
    job.py        the run: select, load, caption each file, progress and status, stop
    tiny.py       a tiny random Qwen2.5-VL folder built locally (tests, the web UI's)

The command line (aitk.cli.caption) turns flags into CaptionSettings and calls
`job.run`; errors rise as aitk.errors classes to the command line's boundary.
"""
