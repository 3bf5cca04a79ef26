"""Task handlers: one per kind of task, registered by name."""
