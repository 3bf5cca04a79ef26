"""``rollserve bench learn``: a tiny policy trained with TRL's GRPO through a real
``rollserve serve`` on this machine's CPUs (``main``), its policy, tasks, runs and figures."""
