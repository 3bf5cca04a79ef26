"""Properties of patch application in SWE evaluation, with real git: the ``git diff`` of any edit
of a small file applies back to exactly the edited content, the paths read out of a patch are
the ones it names (its file contents never taken for headers), and a malformed patch is a
plain failure, never an exception."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from rollserve.sandbox import SandboxInstance, SandboxManager, spec_for
from rollserve.tasks.swe import evaluation
from tests.conformance.conftest import require

PATCH_PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )
    return done.stdout.decode("utf-8", errors="surrogateescape")


class Repo:
    """A git repository as a sandbox's workspace; ``reset`` puts back its first commit."""

    def __init__(self, box: SandboxInstance) -> None:
        self.box = box
        self.path = Path(box.guest_workspace)
        git(self.path, "init", "-q")
        git(self.path, "config", "user.email", "fuzz@example.com")
        git(self.path, "config", "user.name", "fuzz")
        (self.path / "keep.txt").write_text("keep\n")
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "-m", "start")
        self.start = git(self.path, "rev-parse", "HEAD").strip()

    def reset(self) -> None:
        git(self.path, "reset", "-q", "--hard", self.start)
        git(self.path, "clean", "-q", "-fdx", "-e", ".git")

    def diff(self) -> str:
        """The workspace's changes as the sandbox's own ``diff`` writes them."""
        git(self.path, "add", "-A")
        patch = git(self.path, "diff", "--cached", "--binary", "--no-color", "--no-ext-diff")
        git(self.path, "reset", "-q")
        return patch


@pytest.fixture
async def repo(manager: SandboxManager) -> AsyncIterator[Repo]:
    require(manager, "local")
    box = await manager.start(spec_for("local"))
    yield Repo(box)
    await manager.close(box)


# Lines drawn from a few, so that edits leave context that matches (and hunks that are
# ambiguous to a fuzzy patch); endings include CRLF, a bare CR, and none at the end.
lines = st.one_of(
    st.sampled_from(["a", "b", "", "  indented", "\t", "{", "}", "-- sql", "++ x", "@@ -1 +1 @@"]),
    st.text(st.characters(codec="utf-8", exclude_characters="\n\r"), max_size=12),
)
contents = st.builds(
    lambda body, end: "\n".join(body) + end,
    st.lists(lines, max_size=30),
    st.sampled_from(["\n", "", "\r\n", "\r"]),
)


@PATCH_PROPERTY
@given(before=contents, after=contents, name=st.sampled_from(["f.txt", "dir/g.py", "sp ace.sql"]))
@example(before='x\n-- "C:\\x"\ny\n', after="x\ny\n", name="q.sql")
async def test_a_git_diff_applies_back(repo: Repo, before: str, after: str, name: str) -> None:
    assume(before != after)
    repo.reset()
    target = repo.path / name
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(before.encode())
    git(repo.path, "add", "-A")
    git(repo.path, "commit", "-q", "-m", "before")
    target.write_bytes(after.encode())
    patch = repo.diff()
    assert evaluation.patch_paths(patch) == [name]
    git(repo.path, "checkout", "-q", "--", name)
    result = await evaluation.apply_patch(repo.box, patch, "edit")
    assert result.applied == "git apply", result.output
    assert target.read_bytes() == after.encode()


# Any name a file can have, apart from the repository's own .git.
file_names = st.text(
    st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=20
).filter(lambda s: s not in (".", "..", ".git"))


@PATCH_PROPERTY
@given(names=st.lists(file_names, min_size=1, max_size=3, unique=True), text=contents)
@example(names=[" lead and trail ", 'q"uote', "tab\there"], text="x\n")
@example(names=["a b", "x b", "\u2028line sep", "\udcff"], text="x\n")
async def test_paths_of_new_files(repo: Repo, names: list[str], text: str) -> None:
    repo.reset()
    for name in names:
        (repo.path / name).write_bytes(text.encode())
    patch = repo.diff()
    assert sorted(evaluation.patch_paths(patch)) == sorted(names)
    for name in names:
        (repo.path / name).unlink()
    result = await evaluation.apply_patch(repo.box, patch, "new")
    assert result.applied == "git apply", result.output
    for name in names:
        assert (repo.path / name).read_bytes() == text.encode()


def mutate(patch: str, data: st.DataObject) -> str:
    """``patch`` with a few lines dropped, duplicated, cut or replaced by arbitrary text."""
    rows = patch.split("\n")
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(rows) - 1))
        how = data.draw(st.sampled_from(["drop", "dup", "cut", "text"]))
        if how == "drop":
            del rows[i]
        elif how == "dup":
            rows.insert(i, rows[i])
        elif how == "cut":
            rows[i] = rows[i][: data.draw(st.integers(0, max(0, len(rows[i]) - 1)))]
        else:
            rows[i] = data.draw(st.text(st.characters(codec=None, categories=None), max_size=30))
        if not rows:
            rows = [""]
    return "\n".join(rows)


@PATCH_PROPERTY
@given(before=contents, after=contents, data=st.data())
async def test_malformed_patches_fail_plainly(
    repo: Repo, before: str, after: str, data: st.DataObject
) -> None:
    assume(before != after)
    repo.reset()
    target = repo.path / "f.txt"
    target.write_bytes(before.encode())
    git(repo.path, "add", "-A")
    git(repo.path, "commit", "-q", "-m", "before")
    target.write_bytes(after.encode())
    patch = repo.diff()
    git(repo.path, "checkout", "-q", "--", "f.txt")
    broken = mutate(patch, data)
    evaluation.patch_paths(broken)  # must not raise
    result = await evaluation.apply_patch(repo.box, broken, "broken")  # nor this
    if result.applied is None:
        assert "$ git apply" in result.output


@pytest.mark.parametrize(
    "patch",
    [
        '--- "a/\\x"\n+++ "b/\\x"\n',  # a truncated escape
        '--- "a/\\u1234"\n+++ "b/\\N{x}"\n',  # escapes git never writes
        '--- "\\"\n',
        "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-\ud800\n+x\n",  # a lone surrogate
    ],
)
async def test_unreadable_patches_fail_plainly(repo: Repo, patch: str) -> None:
    evaluation.patch_paths(patch)
    result = await evaluation.apply_patch(repo.box, patch, "bad")
    assert result.applied is None
    assert result.output


def test_contents_are_never_headers() -> None:
    """A hunk that removes the line ``-- a/setup.py`` and adds ``++ b/.git/config`` names
    only its own file; a name with spaces at its ends keeps them."""
    patch = (
        "diff --git a/q.sql b/q.sql\n--- a/q.sql\n+++ b/q.sql\n@@ -1,3 +1,3 @@\n x\n"
        "--- a/setup.py\n+++ b/.git/config\n y\n"
        "diff --git a/ x  b/ x \nnew file mode 100644\n--- /dev/null\n+++ b/ x \t\n"
        "@@ -0,0 +1 @@\n+--- a/other\n"
    )
    assert evaluation.patch_paths(patch) == ["q.sql", " x "]
