"""The ``swe`` task kind (``handler``): a prepared repository scored by hidden tests; its
evaluation steps in a sandbox, and ``rollserve tasks prepare-swe`` (``prepare``, ``build``)."""
