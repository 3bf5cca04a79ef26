"""The pipeline: init → run → eval on independent worker pools."""
