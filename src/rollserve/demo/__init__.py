"""``rollserve demo``: rollserve's main job end to end on this machine (``main``), with its
requirement checks, jobs, model processes, service and report."""
