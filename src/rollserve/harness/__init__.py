"""Harnesses: agents that run beside a job's sandbox, in their own process and virtual
environment, and drive the job's sandbox and model through its gateway (``base``). This
package imports only httpx and pydantic, so that it installs into any agent's environment."""

from rollserve.harness.base import CommandOutput, Harness, HarnessJob

__all__ = ["CommandOutput", "Harness", "HarnessJob"]
