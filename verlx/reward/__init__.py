"""Rewards: built-in rule scores (scores/), custom function loading, isolated scoring, reward managers.

Kept import-light (no torch): scoring worker processes import verlx.reward.* modules."""
