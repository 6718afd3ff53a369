"""File kinds a dataset folder may hold (no heavy imports: the preflight reads this)."""

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
# Read when a dataset's num_frames is above 1 (aitk.data.video).
VIDEO_EXTENSIONS = (".mp4", ".webm", ".mov", ".mkv")
TRIGGER_TAG = "[trigger]"  # in captions and prompts: replaced by the trigger word
