"""Figures: sandbox start latency and shell command latency."""
