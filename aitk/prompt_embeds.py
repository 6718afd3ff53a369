"""AdvancedPromptEmbeds: per-item text conditioning (contract; implementation to come).

Every key holds a list with one tensor per batch item. Each tensor is 2-D (L, D) at the
item's natural length; padding to the batch maximum happens only at the model call.
Keys in `frozen_dtype_keys` (token ids, masks) are never dtype-cast.
"""
