"""The ``swebench`` task kind (``handler``): SWE-bench-format rows in their own images
(``rows``), graded by the SWE-bench harness (``harness``) with rollserve's table of its
per-repository specifications (``specs``)."""
