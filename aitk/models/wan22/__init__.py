"""Wan 2.2 14B archs (`wan22_14b`, `wan22_14b_i2v`): two experts on the Wan 2.1 code."""
