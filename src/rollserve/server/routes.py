"""The HTTP API v1 routes (DESIGN.md, Contracts)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import PlainTextResponse

from rollserve.errors import StoreUnavailableError
from rollserve.pipeline.service import RolloutService, view
from rollserve.schema.api import (
    Accepted,
    BatchAccepted,
    BatchRequest,
    GroupCancelled,
    JobQuery,
    JobsPage,
    ResultsPage,
    Trajectory,
)
from rollserve.schema.backends import (
    BackendSpec,
    BackendView,
    ModelState,
    PauseRequest,
    ResumeRequest,
)
from rollserve.schema.jobs import JobRequest, JobView
from rollserve.schema.status import NodeStatus
from rollserve.server.errors import responses
from rollserve.server.metrics import render_metrics


def service(request: Request) -> RolloutService:
    svc: RolloutService = request.app.state.service
    return svc


Service = Annotated[RolloutService, Depends(service)]
WaitS = Annotated[float, Query(ge=0, le=600, description="long-poll seconds")]

health = APIRouter()
api = APIRouter(prefix="/v1", responses=responses(401, 422, 503))
metrics_route = APIRouter(responses=responses(401, 503))
_BODY = responses(400, 403, 413)  # a route with a body: unparsable, read-only token, too large
_WRITE = responses(403)


@health.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@health.get("/readyz", responses=responses(503))
async def readyz(svc: Service) -> dict[str, str]:
    """Ready while the node's heartbeat reaches the job store and its data directory has room
    for sandboxes (503 with the reason if not)."""
    problem = svc.scheduler.problem()
    if problem is not None:
        raise StoreUnavailableError(problem)
    return {"status": "ready", "node": svc.scheduler.node}


@api.post("/jobs", status_code=202, response_model=Accepted, responses=_BODY | responses(409, 429))
async def submit(job: JobRequest, svc: Service) -> Accepted:
    [done] = await svc.submit([job])
    return Accepted(job_id=done.job_id, status=done.status.value, created=done.created)


@api.post(
    "/jobs/batch",
    status_code=202,
    response_model=BatchAccepted,
    responses=_BODY | responses(409, 429),
)
async def submit_batch(batch: BatchRequest, svc: Service) -> BatchAccepted:
    done = await svc.submit(batch.jobs)
    return BatchAccepted(
        jobs=[Accepted(job_id=d.job_id, status=d.status.value, created=d.created) for d in done]
    )


@api.get("/jobs", response_model=JobsPage)
async def list_jobs(svc: Service, query: Annotated[JobQuery, Query()]) -> JobsPage:
    """A page of jobs, filtered and sorted (the viewer's jobs table); no trajectories."""
    return await svc.list_jobs(query)


@api.get("/jobs/{job_id}/trajectory", response_model=Trajectory, responses=responses(404))
async def get_trajectory(job_id: str, svc: Service) -> Trajectory:
    """The job's rollout turn by turn; a running job's turns so far (``live``)."""
    return await svc.trajectory(job_id)


@api.get("/jobs/{job_id}", response_model=JobView, responses=responses(404))
async def get_job(job_id: str, svc: Service, wait: WaitS = 0) -> JobView:
    return view(await svc.wait(job_id, wait))


@api.delete("/jobs/{job_id}", response_model=JobView, responses=_WRITE | responses(404))
async def cancel_job(job_id: str, svc: Service) -> JobView:
    return view(await svc.cancel(job_id))


@api.post("/groups/{group_id}/cancel", response_model=GroupCancelled, responses=_WRITE)
async def cancel_group(group_id: str, svc: Service) -> GroupCancelled:
    return GroupCancelled(group_id=group_id, cancelled=await svc.cancel_group(group_id))


@api.get("/results", response_model=ResultsPage)
async def results(
    svc: Service,
    after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    wait: WaitS = 0,
) -> ResultsPage:
    found = await svc.results(after, limit, wait)
    cursor = max((r.done_seq or 0 for r in found), default=after)
    return ResultsPage(results=[view(r) for r in found], next=cursor)


@api.post("/llm/backends", status_code=201, response_model=BackendView, responses=_BODY)
async def register_backend(spec: BackendSpec, svc: Service) -> BackendView:
    return await svc.router.register(spec)


@api.get("/llm/backends", response_model=list[BackendView])
async def list_backends(svc: Service) -> list[BackendView]:
    return svc.router.views()


@api.delete("/llm/backends/{backend_id}", status_code=204, responses=_WRITE | responses(404))
async def remove_backend(backend_id: str, svc: Service) -> Response:
    await svc.router.remove(backend_id)
    return Response(status_code=204)


@api.post("/llm/models/{model}/pause", response_model=ModelState, responses=_BODY)
async def pause_model(model: str, svc: Service, body: PauseRequest | None = None) -> ModelState:
    return await svc.pause_model(model, body or PauseRequest())


@api.post("/llm/models/{model}/resume", response_model=ModelState, responses=_BODY)
async def resume_model(model: str, svc: Service, body: ResumeRequest | None = None) -> ModelState:
    return await svc.router.resume(model, body or ResumeRequest())


@api.get("/llm/models/{model}", response_model=ModelState)
async def model_state(model: str, svc: Service) -> ModelState:
    return await svc.model_state(model)


@api.get("/status", response_model=NodeStatus)
async def status(svc: Service) -> NodeStatus:
    return await svc.status()


@metrics_route.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(svc: Service) -> Response:
    """Prometheus' text format."""
    body, content_type = render_metrics(await svc.status())
    return Response(content=body, media_type=content_type)
