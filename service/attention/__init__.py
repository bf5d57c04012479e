"""Attention maps: capture, summaries (rollout, alignment), the store behind ids, views and heatmaps."""
