"""The operator's work queue: dedup, one run per key at a time, one re-run for an add during a run,
delayed adds (earliest wins), backoff, discard, the urgent lane."""

from __future__ import annotations

import threading
import time

from kompile.operator.workqueue import WorkQueue, start_workers


def test_a_key_added_twice_waits_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("b")
    q.add("a")
    assert len(q) == 2
    assert q.get() == "a" and q.get() == "b"


def test_a_key_added_while_processing_runs_again_once_after() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert q.get() == "a"
    q.add("a")
    q.add("a")
    assert len(q) == 0  # not handed to a second worker while the first runs it
    q.done("a")
    assert len(q) == 1 and q.get() == "a"
    q.done("a")
    assert len(q) == 0


def test_delayed_adds_come_due_and_the_earliest_wins() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("late", 30)
    q.add_after("soon", 0.2)
    q.add_after("late", 0.1)  # an earlier delay for the same key replaces the later one
    began = time.monotonic()
    assert q.get() == "late" and q.get() == "soon"
    assert 0.1 <= time.monotonic() - began < 5
    assert q.delayed == 0


def test_retry_backs_off_and_forget_resets() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=1, max_delay=4)
    assert [q.retry("a") for _ in range(4)] == [1, 2, 4, 4]
    q.forget("a")
    assert q.retry("a") == 1


def test_discard_drops_a_queued_and_a_delayed_key() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add_after("b", 0.05)
    q.discard("a")
    q.discard("b")
    time.sleep(0.1)
    q.add("c")
    assert q.get() == "c" and len(q) == 0 and q.delayed == 0


def test_workers_never_run_one_key_concurrently_and_see_the_last_add() -> None:
    q: WorkQueue[str] = WorkQueue()
    running: set[str] = set()
    overlap: list[str] = []
    runs: dict[str, int] = {}
    guard = threading.Lock()

    def process(key: str) -> None:
        with guard:
            if key in running:
                overlap.append(key)
            running.add(key)
            runs[key] = runs.get(key, 0) + 1
        time.sleep(0.01)
        with guard:
            running.discard(key)

    start_workers(q, process, 4)
    for _ in range(50):
        for key in ("a", "b", "c"):
            q.add(key)
        time.sleep(0.002)
    deadline = time.monotonic() + 5
    while (len(q) or any(running)) and time.monotonic() < deadline:
        time.sleep(0.01)
    q.shutdown()
    assert not overlap
    assert set(runs) == {"a", "b", "c"} and all(n < 50 for n in runs.values()), runs


def test_a_failing_key_is_retried_and_the_worker_lives_on() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=0.05)
    seen: list[str] = []

    def process(key: str) -> None:
        seen.append(key)
        if len(seen) == 1:
            raise RuntimeError("first try fails")

    start_workers(q, process, 1)
    q.add("a")
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    q.shutdown()
    assert seen == ["a", "a"]


def test_an_urgent_key_goes_ahead_of_the_backlog() -> None:
    """A Job's outcome (urgent) is reconciled before the first looks that queued up before it."""
    q: WorkQueue[str] = WorkQueue()
    for key in ("new-1", "new-2", "new-3"):
        q.add(key)
    q.add("finished", urgent=True)
    q.add("new-2", urgent=True)  # already queued: moves up, still once
    assert [q.get() for _ in range(4)] == ["finished", "new-2", "new-1", "new-3"]
    assert len(q) == 0


def test_an_urgent_delayed_add_and_an_urgent_add_during_processing_stay_urgent() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("backlog")
    q.add_after("job-ended", 0.05, urgent=True)
    time.sleep(0.1)
    assert q.get() == "job-ended"  # came due ahead of the older ordinary key
    q.add("job-ended", urgent=True)  # while it is processed: its re-run goes first too
    q.done("job-ended")
    assert q.get() == "job-ended" and q.get() == "backlog"


def test_the_worker_knows_a_run_came_from_the_urgent_lane() -> None:
    """So that run stays short: its slow part (MLflow, rollout) is requeued as ordinary work."""
    q: WorkQueue[str] = WorkQueue()
    q.add("first-look")
    q.add("job-ended", urgent=True)
    assert q.get() == "job-ended" and q.taken_urgent("job-ended")
    q.add("job-ended")  # the slow part, asked for by the urgent run: an ordinary re-run
    q.done("job-ended")
    assert not q.taken_urgent("job-ended")
    assert q.get() == "first-look" and not q.taken_urgent("first-look")
    assert q.get() == "job-ended" and not q.taken_urgent("job-ended")


def test_namespaces_take_turns_so_one_tenants_burst_does_not_hold_another() -> None:
    """A GitOps sync of 1,000 CompiledModels in one namespace queued ahead of everything else:
    another namespace's model added after it waited for all of them (about 280 s of first looks at
    1,000 on 2 cores). Keys are taken from the namespaces in turn, first come first within each."""
    q: WorkQueue[tuple[str, str]] = WorkQueue()
    for i in range(1000):
        q.add(("team-a", f"m{i}"))
    q.add(("team-b", "one"))
    q.add(("team-b", "two"))
    q.add(("team-a", "m0"))  # already waiting: still once
    assert len(q) == 1002
    taken = [q.get() for _ in range(5)]
    assert taken == [
        ("team-a", "m0"),
        ("team-b", "one"),
        ("team-a", "m1"),
        ("team-b", "two"),
        ("team-a", "m2"),
    ]
    q.discard(("team-a", "m3"))
    q.add(("team-b", "three"), urgent=True)  # the urgent lane goes ahead of both, as before
    assert q.get() == ("team-b", "three")
    assert q.get() == ("team-a", "m4")
    assert len(q) == 1002 - 5 - 1 - 1
