"""Training data: image folders with captions, aspect buckets, seeded order, caches."""
