"""File kinds a dataset folder may hold (no heavy imports: the preflight reads this)."""

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
TRIGGER_TAG = "[trigger]"  # in captions and prompts: replaced by the trigger word
