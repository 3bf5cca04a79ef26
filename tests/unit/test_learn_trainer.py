"""The bench's GRPO trainer takes its PPO ratio against the policy that generated each token:
the rollout's logprobs become the "old" logprobs, unless the trainer computed its own."""

from __future__ import annotations

from typing import Any

from rollserve.learn.run import behaviour_clipped


class Base:
    """Stands in for GRPOTrainer's batch preparation (what it returns, nothing more)."""

    def __init__(self, output: dict[str, Any]) -> None:
        self.output = output

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        return dict(self.output)


def test_the_rollout_logprobs_become_the_old_logprobs() -> None:
    trainer = behaviour_clipped(Base)({"sampling_per_token_logps": [[-0.5, -1.0]]})
    out = trainer._generate_and_score_completions({})
    assert out["old_per_token_logps"] == [[-0.5, -1.0]]


def test_logprobs_the_trainer_computed_are_kept() -> None:
    given = {"sampling_per_token_logps": [[-0.5]], "old_per_token_logps": [[-0.7]]}
    out = behaviour_clipped(Base)(given)._generate_and_score_completions({})
    assert out["old_per_token_logps"] == [[-0.7]]


def test_without_rollout_logprobs_nothing_is_added() -> None:
    out = behaviour_clipped(Base)({"advantages": [1.0]})._generate_and_score_completions({})
    assert "old_per_token_logps" not in out
