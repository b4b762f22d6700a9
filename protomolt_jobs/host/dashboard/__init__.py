"""The web dashboard at ``/ui``: server-rendered pages over the catalog verbs.

Pages (Jinja2 templates in ``templates/``, one stylesheet and one small script in ``static/``;
no build step, nothing fetched from a CDN):

- ``/ui`` the jobs, newest first, with filters (status, workflow, created after) and paging,
  and a bulk form (``POST /ui/bulk``: cancel, requeue or retry the ticked jobs, one outcome
  per job);
- ``/ui/inbox`` the RECOVERY_REQUIRED and WAITING jobs: work for people (runs waiting for an
  input list the missing paths with their owners and a ``supply-input`` form);
- ``/ui/workflows`` the stored workflows (names from the registry's repository), each read with
  ``get-workflow`` as the signed-in caller: its version, who stored it and when, its retention
  per final status, and the last result of its tests (per case, the first difference of a
  failing one; when and by whom it ran);
- ``/ui/jobs/{id}`` one job: the row's fields, the steps as a timeline, the workflow drawn as an
  SVG (``drawing.py``, from get-job's ``graph``) with the steps' reasons, a finished job's final
  report as tables (``_graph.html``, ``_report.html``), checkpoints as JSON, the events (outbox
  rows), the operator actions that apply to its status (``operate.py``: each confirmed,
  answered by a redirect back with a one-time message, ``flash.py``), the run's artifacts
  (``list-artifacts``: step, port, state, hash) with a ``promote-artifact`` form on each
  ``verified`` one, and for a WAITING job a
  complete-step form generated from the parked step's answer type (``answer_form.py``), or for
  a run waiting for input a ``supply-input`` form (``POST /ui/jobs/{id}/supply``); for a live
  job, ``explain-job``'s account (*Why is it waiting?*: per undecided step what blocks it and
  the missing inputs with their owners);
- ``/ui/login`` a token form when the node has tokens (``api_token``, ``[node.tokens]`` or an
  identity hook): a token the node's authority resolves is kept in an HttpOnly,
  ``SameSite=Strict`` cookie the token guard accepts (so the cookie cannot ride a cross-site
  form post); an unknown token is refused on the form (401, "Wrong token ...").

The dashboard acts as the signed-in token's principal: the token guard resolves the cookie to a
:class:`~protomolt_jobs.host.catalog.Caller` and every verb runs as it, so a button pressed
while signed in as ``editor-1`` is recorded with actor ``editor-1``, and a verb outside its
scopes is ``permission-denied`` (recorded like any refusal). Pages offer only what the caller
may run: the operator buttons and the complete-step form of the verbs its scopes allow (the
catalog manifest for that caller).

Every read and every change goes through the catalog verbs (``list-jobs``, ``get-job``,
``complete-step``, and the operator verbs when mounted), so the dashboard validates exactly
like the API: bad input shows the verb's ``invalid-input`` message on the page, never a 500.
Only what no verb returns is read through the role's :class:`~protomolt_jobs.runs.inspector.JobInspector`
(the events, the step list, the answer type of a parked step).

Live updates: pages poll themselves (``static/dashboard.js``) every few seconds and replace the
``data-live`` region with the server's fresh rendering; forms are never replaced.
"""

from __future__ import annotations

import datetime
import json
import logging
import urllib.parse
from pathlib import Path
from typing import Any

import anyio.to_thread
import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route, Router
from starlette.staticfiles import StaticFiles

from protomolt_jobs.errors import ActionError, Unavailable
from protomolt_jobs.host.authority import Authority
from protomolt_jobs.host.catalog import Caller
from protomolt_jobs.host.dashboard import drawing, operate, times
from protomolt_jobs.host.dashboard.answer_form import answer_from_form, form_field
from protomolt_jobs.host.dashboard.body_limit import BodyLimit
from protomolt_jobs.host.dashboard.flash import COOKIE as FLASH_COOKIE
from protomolt_jobs.host.dashboard.flash import TTL_S as FLASH_TTL_S
from protomolt_jobs.host.dashboard.flash import Flash, Flashes
from protomolt_jobs.host.http_route import caller_of

__all__ = [
    "PREFIX",
    "TOKEN_COOKIE",
    "dashboard_mount",
    "is_public",
    "login_redirect",
    "slash_redirect",
]

log = logging.getLogger("protomolt_jobs.dashboard")

PREFIX = "/ui"
#: How a verb error that the database cannot be reached begins (the pages answer 503).
_UNAVAILABLE = "unavailable:"
#: How a verb error for a scope the caller lacks begins (the pages answer 403).
_DENIED = "permission-denied:"
#: The cookie holding the API token after a login.
TOKEN_COOKIE = "protomolt_token"
#: Jobs per page.
PAGE_SIZE = 50
#: The last page whose offset PostgreSQL's bigint (list-jobs' ``offset``) holds.
MAX_PAGE = (2**63 - 1) // PAGE_SIZE + 1
#: Seconds between live refreshes of a page.
REFRESH_S = 3
STATUSES = (
    "QUEUED",
    "RUNNING",
    "WAITING",
    "PAUSED",
    "RECOVERY_REQUIRED",
    "COMPLETED",
    "FAILED",
    "DEAD",
    "CANCELLED",
)
#: Operator verbs a job page may offer (each only for the statuses it acts on).
OPERATOR_VERBS = operate.OPERATOR_VERBS
#: Jobs one bulk action may name.
BULK_MAX = 500
#: Stored workflows the workflows page shows (by name).
WORKFLOWS_MAX = 200

_HERE = Path(__file__).parent
_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(_HERE / "templates")),
    autoescape=jinja2.select_autoescape(["html"]),
)
_env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
# "2026-12-01T15:55:32.919918Z" -> "2026-12-01 15:55:32" (UTC, as every time on the pages).
_env.filters["when"] = lambda value: (str(value or "")[:19]).replace("T", " ")
drawing.install(_env)  # the workflow's drawing (graph_svg, graph_ms, graph_legend)
# "3 min ago" / "in 2 h" beside an absolute time; the duration between two times.
_env.filters["ago"] = times.relative
_env.filters["took"] = times.between


def _kept_for(seconds: Any) -> str:
    """A retention in seconds as ``30d`` / ``12h`` / ``90m`` / ``45s``; None: ``kept``."""
    if not isinstance(seconds, (int, float)):
        return "kept"
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


_env.filters["kept_for"] = _kept_for


def is_public(path: str) -> bool:
    """Dashboard paths served without the token: the login form and the static assets."""
    return path == f"{PREFIX}/login" or path.startswith(f"{PREFIX}/static/")


def login_redirect(path: str) -> str | None:
    """Where a browser without the token is sent: the login form, for dashboard pages."""
    return f"{PREFIX}/login" if path == PREFIX or path.startswith(f"{PREFIX}/") else None


class Dashboard:
    """The dashboard's endpoints over a node's catalog and its jobs role's inspector.

    :param catalog: the node catalog (``manifest(caller)``, ``execute(name, input, caller=)``).
    :param inspector: the jobs role's :class:`JobInspector`, or None (no events or forms).
    :param authority: the node's resolver (an open one: no login).
    :param workflows: the registry's ``WorkflowRepository`` (its ``names()``), or None.
    """

    def __init__(
        self, catalog: Any, inspector: Any, authority: Authority, workflows: Any = None
    ) -> None:
        self.catalog = catalog
        self.inspector = inspector
        self.authority = authority
        self.workflows = workflows
        self.flashes = Flashes()

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _caller(request: Request) -> Caller:
        """Who is signed in (the token guard resolved it); a request that reached a page
        without one (a public path) holds no scope at all."""
        return caller_of(request.scope) or Caller("anonymous")

    async def _verb(
        self, request: Request, name: str, envelope: dict[str, Any]
    ) -> tuple[dict[str, Any], str]:
        """Run a verb as the signed-in caller, off the event loop: ``(answer, "")`` or
        ``({}, "code: message")``."""

        def run() -> dict[str, Any]:
            answer: dict[str, Any] = self.catalog.execute(
                name, envelope, caller=self._caller(request)
            )
            return answer

        try:
            answer = await anyio.to_thread.run_sync(run)
        except ActionError as exc:
            field = (exc.details or {}).get("field")
            if isinstance(field, str) and f"'{field}'" not in exc.message:
                # the page names the form field even where the verb's sentence does not
                return {}, f"{exc.code}: '{field}': {exc.message}"
            return {}, f"{exc.code}: {exc.message}"
        return answer, ""

    async def _inspect(self, method: str, *args: Any, unavailable_raises: bool = False) -> Any:
        if self.inspector is None:
            return None
        try:
            return await anyio.to_thread.run_sync(getattr(self.inspector, method), *args)
        except Unavailable:
            if unavailable_raises:
                raise
            log.warning(
                "dashboard: %s unavailable",
                method,
                exc_info=True,
                extra={"action": "dashboard_inspect_failed"},
            )
            return None
        except Exception:  # the page still renders; the part is shown as unavailable
            log.warning(
                "dashboard: %s unavailable",
                method,
                exc_info=True,
                extra={"action": "dashboard_inspect_failed"},
            )
            return None

    def _render(self, request: Request, template: str, status: int = 200, **ctx: Any) -> Response:
        live_only = request.headers.get("x-live") == "1"
        name = template.replace(".html", "_live.html") if live_only else template
        try:
            page = _env.get_template(name)
        except jinja2.TemplateNotFound:
            page = _env.get_template(template)
        caller = caller_of(request.scope)
        verbs = self._verbs(request)
        flash = None if live_only else self.flashes.take(request.cookies.get(FLASH_COOKIE))
        html = page.render(
            prefix=PREFIX,
            refresh_s=REFRESH_S,
            login=not self.authority.open,
            principal=caller.name if caller is not None and not self.authority.open else "",
            verbs=verbs,
            flash=flash,
            **ctx,
        )
        response = HTMLResponse(html, status_code=status)
        if not live_only and FLASH_COOKIE in request.cookies:
            response.delete_cookie(FLASH_COOKIE, path=PREFIX)
        return response

    def _redirect(self, url: str, flash: Flash) -> Response:
        """``303`` to ``url`` with ``flash`` waiting for it (POST-redirect-GET)."""
        response = RedirectResponse(url, status_code=303)
        response.set_cookie(
            FLASH_COOKIE,
            self.flashes.put(flash),
            max_age=int(FLASH_TTL_S),
            httponly=True,
            samesite="strict",
            path=PREFIX,
        )
        return response

    def _verbs(self, request: Request) -> set[str]:
        """The verbs the signed-in caller may run (the catalog's manifest for it)."""
        return {
            str(a.get("name"))
            for a in self.catalog.manifest(self._caller(request))
            if isinstance(a, dict)
        }

    @staticmethod
    def _cross_site(request: Request) -> bool:
        """True for a form post another site's page made (its ``Origin`` names another host).

        The token cookie is ``SameSite=Strict``, but a node without a token has no cookie to
        withhold: the origin check keeps a foreign page from pressing the buttons.
        """
        from protomolt_jobs.host.http_route import cross_site

        return cross_site(request.headers)

    def _refused(self, request: Request) -> Response:
        return self._render(
            request,
            "login.html",
            status=403,
            title="Refused",
            error="permission-denied: a form of another site cannot act on this node",
        )

    @staticmethod
    async def _form(request: Request) -> dict[str, str]:
        body = (await request.body()).decode("utf-8", errors="replace")
        return {k: v[-1] for k, v in urllib.parse.parse_qs(body, keep_blank_values=True).items()}

    # -- pages -----------------------------------------------------------------------------

    async def jobs(self, request: Request) -> Response:
        """``GET /ui``: the jobs list (filters: status, workflow, queue, id, after; page). The id
        filter takes a job id or its start (dashes left out: ``list-jobs``' ``idPrefix``); when
        exactly one job matches, the page redirects to it."""
        q = request.query_params
        status = q.get("status", "")
        workflow = q.get("workflow", "").strip()
        queue = q.get("queue", "").strip()
        job_id = q.get("id", "").strip()
        after = q.get("after", "").strip()
        try:
            page = max(int(q.get("page", "1")), 1)
        except ValueError:
            page = 1
        page_error = ""
        if page > MAX_PAGE:  # the offset would not fit list-jobs' bigint: name what was typed
            page_error = f"invalid-input: 'page' must be at most {MAX_PAGE}; got {page}"
            page = 1
        envelope: dict[str, Any] = {"limit": PAGE_SIZE + 1, "offset": (page - 1) * PAGE_SIZE}
        if status:
            envelope["status"] = status
        if workflow:
            envelope["workflowName"] = workflow
        if queue:
            envelope["queue"] = queue
        if job_id:
            envelope["idPrefix"] = job_id.replace("-", "")
        answer, error = await self._verb(request, "list-jobs", envelope)
        error = page_error or error
        jobs = list(answer.get("jobs", [])) if not page_error else []
        if job_id and len(jobs) == 1 and not error and request.headers.get("x-live") != "1":
            found = urllib.parse.quote(str(jobs[0].get("jobId", "")))
            return RedirectResponse(f"{PREFIX}/jobs/{found}", status_code=303)
        more = len(jobs) > PAGE_SIZE
        notice = ""
        if job_id and len(jobs) > 1 and not error:  # an ambiguous start: name the candidates
            many = f"more than {PAGE_SIZE}" if more else str(len(jobs))
            notice = f"{many} jobs start with {job_id!r}: pick one below, or type more of its id"
        jobs = jobs[:PAGE_SIZE]
        if after and not error:
            try:
                cut = datetime.datetime.fromisoformat(after)
                if cut.tzinfo is None:
                    cut = cut.replace(tzinfo=datetime.UTC)
                jobs = [
                    j
                    for j in jobs
                    if datetime.datetime.fromisoformat(j.get("createdAt", "")) >= cut
                ]
            except ValueError:
                error = f"invalid-input: 'after' must be a date and time like 2026-01-31T12:00; got {after!r}"
        counts = None
        down = error.startswith(_UNAVAILABLE)
        if page == 1 and not (status or workflow or queue or job_id or after or error):
            counts = await self._counts()
        filters = {
            "status": status,
            "workflow": workflow,
            "queue": queue,
            "id": job_id,
            "after": after,
        }
        base = {k: v for k, v in filters.items() if v}
        return self._render(
            request,
            "jobs.html",
            status=503 if down else 403 if error.startswith(_DENIED) else 200,
            title="Jobs",
            jobs=jobs,
            error=error,
            filters=filters,
            statuses=STATUSES,
            page=page,
            prev_url=f"{PREFIX}/?{urllib.parse.urlencode({**base, 'page': page - 1})}"
            if page > 1
            else "",
            next_url=f"{PREFIX}/?{urllib.parse.urlencode({**base, 'page': page + 1})}"
            if more
            else "",
            counts=counts,
            query=request.url.query,
            notice=notice,
            bulk_scope=", ".join(
                sorted(
                    {
                        scope
                        for verb, scope in operate.scopes(
                            self.catalog.manifest(self._caller(request))
                        ).items()
                        if verb in operate.BULK_VERBS
                    }
                )
            ),
            bulk_verbs=operate.BULK_VERBS,
        )

    async def _counts(self) -> dict[str, int] | None:
        store_view = getattr(self.inspector, "_open", None)
        if store_view is None:
            return None
        try:
            store = await anyio.to_thread.run_sync(store_view)
            runs, _ = await anyio.to_thread.run_sync(store.metrics_counts)
        except Exception:  # counts are a nicety; the list still renders
            log.warning(
                "dashboard: run counts unavailable",
                exc_info=True,
                extra={"action": "dashboard_counts_failed"},
            )
            return None
        return {s: sum(n for (status, _), n in runs.items() if status == s) for s in STATUSES}

    async def inbox(self, request: Request) -> Response:
        """``GET /ui/inbox``: the WAITING jobs: approvals the signed-in caller may vote on
        (its principal or one of its groups is an approver; with the votes so far and a vote
        form), then the jobs parked on an external step."""
        answer, error = await self._verb(request, "list-jobs", {"status": "WAITING", "limit": 500})
        waiting = answer.get("jobs", [])
        recovery: list[dict[str, Any]] = []
        if not error:
            stuck, error = await self._verb(
                request, "list-jobs", {"status": "RECOVERY_REQUIRED", "limit": 500}
            )
            recovery = list(stuck.get("jobs", []))
        caller = self._caller(request)
        inputs = []
        verbs = self._verbs(request)
        if "explain-job" in verbs:
            for job in waiting:
                if job.get("phase") != "waiting_input":
                    continue
                account, _ = await self._verb(request, "explain-job", {"jobId": job["jobId"]})
                inputs.append({"job": job, "missing": _missing_inputs(account.get("explain"))})
        approvals = []
        if "approve-step" in verbs:
            for job in waiting:
                if job.get("phase") != "waiting_approval":
                    continue
                view = await self._inspect("approval", job["jobId"], job["outstandingStep"])
                if view is not None and _may_vote(view, caller):
                    approvals.append({"job": job, "approval": view})
        return self._render(
            request,
            "inbox.html",
            status=_error_status(error, 200),
            title="Inbox",
            jobs=[
                j for j in waiting if j.get("phase") not in ("waiting_approval", "waiting_input")
            ],
            approvals=approvals,
            inputs=inputs,
            recovery=recovery,
            error=error,
        )

    async def workflow_list(self, request: Request) -> Response:
        """``GET /ui/workflows``: every stored workflow (at most :data:`WORKFLOWS_MAX`, by
        name) with its version, retention and last test result (``get-workflow``)."""
        names: list[str] = []
        error = ""
        if self.workflows is None:
            error = "unavailable: no workflow registry is mounted on this node"
        else:
            try:
                names = await anyio.to_thread.run_sync(self.workflows.names)
            except Exception as exc:  # the page says so; never a 500
                log.warning(
                    "dashboard: workflow names unavailable",
                    exc_info=True,
                    extra={"action": "dashboard_workflows_failed"},
                )
                error = f"unavailable: the stored workflows cannot be listed: {exc}"
        rows = []
        for name in names[:WORKFLOWS_MAX]:
            answer, failed = await self._verb(request, "get-workflow", {"workflowName": name})
            if failed:
                error = failed
                break
            rows.append({"name": name, **answer})
        return self._render(
            request,
            "workflows.html",
            status=_error_status(error, 200),
            title="Workflows",
            workflows=rows,
            more=max(len(names) - WORKFLOWS_MAX, 0),
            error=error,
        )

    async def job(
        self,
        request: Request,
        *,
        message: str = "",
        error: str = "",
        form: dict[str, str] | None = None,
        status: int = 200,
    ) -> Response:
        """``GET /ui/jobs/{id}``: one job."""
        job_id = request.path_params["job_id"]
        answer, verb_error = await self._verb(request, "get-job", {"jobId": job_id, "graph": True})
        job = answer.get("job") if answer.get("ok") else None
        if job is None:
            return self._no_job(request, job_id, verb_error or answer.get("error", "no such job"))
        return await self._job_page(request, job, message, error, form, status)

    def _no_job(self, request: Request, job_id: str, error: str) -> Response:
        """The job page without a job: 404, 403 when the caller may not read it, or 503 while
        the database cannot be reached."""
        return self._render(
            request,
            "job.html",
            status=_error_status(error, 404),
            title="Job",
            job=None,
            job_id=job_id,
            error=error,
            message="",
            timeline=[],
            events=[],
            fields=[],
            form={},
            answer_type="",
        )

    async def _job_page(
        self,
        request: Request,
        job: dict[str, Any],
        message: str,
        error: str,
        form: dict[str, str] | None,
        status: int,
    ) -> Response:
        job_id = request.path_params["job_id"]
        names = await self._inspect("step_names", job_id) or []
        graph = {g["name"]: g["after"] for g in await self._inspect("step_graph", job_id) or []}
        done = {c.get("name"): c for c in job.get("checkpoints") or [] if isinstance(c, dict)}
        timeline: list[dict[str, Any]] = []
        for name in names or list(done):
            entry = done.get(name)
            if entry is not None:
                state = "skipped" if entry.get("skipped") else "done"
            elif job.get("outstandingStep") == name:
                state = "waiting"
            elif job["status"] == "RUNNING" and not any(t["state"] == "next" for t in timeline):
                state = "next"
            else:
                state = "pending"
            timeline.append({"name": name, "state": state, "after": graph.get(name, [])})
        events = await self._inspect("events", job_id) or []
        history: dict[str, Any] = {}
        if "job-history" in self._verbs(request):
            history, history_error = await self._verb(request, "job-history", {"jobId": job_id})
            if history_error:
                history = {"integrity": history_error}
        fields: list[dict[str, Any]] = []
        answer_type = ""
        approval = None
        if job.get("phase") == "waiting_approval":
            approval = await self._inspect("approval", job_id, job["outstandingStep"])
            if approval is not None:
                approval["mayVote"] = _may_vote(approval, self._caller(request))
        elif job.get("phase") == "waiting_input":
            pass  # supply-input fills it: no complete-step form
        elif job["status"] == "WAITING" and job.get("outstandingStep"):
            desc = await self._inspect("answer_type", job_id, job["outstandingStep"])
            if desc is not None:
                answer_type = desc.full_name
                fields = [form_field(f) for f in desc.fields]
        manifest = self.catalog.manifest(self._caller(request))
        explained = None
        if job["status"] not in _FINISHED and "explain-job" in self._verbs(request):
            account, _ = await self._verb(request, "explain-job", {"jobId": job_id})
            explained = account.get("explain")
        loop_steps = operate.loop_steps(job)
        artifacts: list[dict[str, Any]] = []
        if "list-artifacts" in self._verbs(request) and request.headers.get("x-live") != "1":
            # the artifacts list sits outside the live region: a refresh does not need it
            listed, _ = await self._verb(request, "list-artifacts", {"jobId": job_id})
            artifacts = [a for a in listed.get("artifacts") or [] if isinstance(a, dict)]
        return self._render(
            request,
            "job.html",
            status=status,
            title=f"Job {job_id}",
            job=job,
            job_id=job_id,
            error=error,
            message=message,
            timeline=timeline,
            events=events,
            fields=fields,
            form=form or {},
            answer_type=answer_type,
            operator_verbs=OPERATOR_VERBS,
            offered=operate.offered(
                operate.status_table(manifest), job["status"], loops=bool(loop_steps)
            ),
            loop_steps=loop_steps,
            verb_scopes=operate.scopes(manifest),
            checkpointed=operate.migratable(job, names or list(done), done),
            zones=times.zones(),
            default_zone=times.DEFAULT_ZONE,
            history=history,
            step_names=names or list(done),
            graph=bool(graph),
            approval=approval,
            explain=explained,
            missing_inputs=_missing_inputs(explained),
            artifacts=artifacts,
        )

    async def approve(self, request: Request) -> Response:
        """``POST /ui/jobs/{id}/approve``: approve-step from the vote form (``stepName``,
        ``decision``, ``comment``); back to the job page with the answer."""
        if self._cross_site(request):
            return self._refused(request)
        job_id = request.path_params["job_id"]
        form = await self._form(request)
        envelope: dict[str, Any] = {
            "jobId": job_id,
            "stepName": form.get("stepName", ""),
            "decision": form.get("decision", ""),
        }
        if form.get("comment", "").strip():
            envelope["comment"] = form["comment"].strip()
        answer, error = await self._verb(request, "approve-step", envelope)
        if error.startswith(_UNAVAILABLE):  # no second wait for the same database
            return self._no_job(request, job_id, error)
        if error or not answer.get("ok"):
            why = error or f"{answer.get('error', 'refused')}: {answer.get('message', '')}"
            return await self.job(request, error=why, status=_error_status(error, 400))
        if answer.get("decided"):
            message = f"decided: {answer.get('decision')}"
        else:
            message = "vote counted: " + ", ".join(
                f"{d} {n}/{answer.get('needed')}" for d, n in sorted(answer["tally"].items())
            )
        return await self.job(request, message=message)

    async def complete(self, request: Request) -> Response:
        """``POST /ui/jobs/{id}/complete``: complete-step from the generated form; back to the
        job page (303) with the outcome as a message, the values typed kept in the form when
        the verb refused them. An unreachable database answers the 503 page, a scope the
        caller lacks the 403 page."""
        if self._cross_site(request):
            return self._refused(request)
        job_id = request.path_params["job_id"]
        page = f"{PREFIX}/jobs/{urllib.parse.quote(job_id)}"
        form = await self._form(request)
        step = form.get("stepName", "")
        try:
            desc = await self._inspect("answer_type", job_id, step, unavailable_raises=True)
        except Unavailable as exc:
            return self._no_job(request, job_id, f"{exc.code}: {exc.message}")
        fields = [form_field(f) for f in desc.fields] if desc is not None else []
        response = answer_from_form(fields, form)
        answer, error = await self._verb(
            request, "complete-step", {"jobId": job_id, "stepName": step, "response": response}
        )
        if error.startswith(_UNAVAILABLE):  # no second wait for the same database
            return self._no_job(request, job_id, error)
        if error.startswith(_DENIED):
            return await self.job(request, error=error, status=403)
        if error or not answer.get("ok"):
            why = error or f"refused: {answer.get('error', 'refused')}"
            return self._redirect(page, Flash("error", f"complete-step: {why}", form=form))
        status = answer.get("status", "")
        done = f"complete-step: step {step!r} answered" + (
            f"; the job is {status}" if status else ""
        )
        return self._redirect(page, Flash("message", done))

    async def supply(self, request: Request) -> Response:
        """``POST /ui/jobs/{id}/supply``: supply-input from the form (``path``, ``value``,
        ``reason``); ``value`` is read as JSON when it parses, else as the text typed (a
        string field's value needs no quotes). Back to the job page (303) with the outcome:
        the job queued, or the verb's refusal (``invalid-input`` naming the field)."""
        if self._cross_site(request):
            return self._refused(request)
        job_id = request.path_params["job_id"]
        page = f"{PREFIX}/jobs/{urllib.parse.quote(job_id)}"
        form = await self._form(request)
        envelope: dict[str, Any] = {"jobId": job_id, "path": form.get("path", "")}
        raw = form.get("value", "")
        if raw.strip():
            try:
                envelope["value"] = json.loads(raw)
            except ValueError:
                envelope["value"] = raw
        if form.get("reason", "").strip():
            envelope["reason"] = form["reason"].strip()
        answer, error = await self._verb(request, "supply-input", envelope)
        if error.startswith(_UNAVAILABLE):  # no second wait for the same database
            return self._no_job(request, job_id, error)
        if error.startswith(_DENIED):
            return await self.job(request, error=error, status=403)
        if error or not answer.get("ok"):
            why = error or f"{answer.get('error', 'refused')}: {answer.get('message', '')}"
            return self._redirect(page, Flash("error", f"supply-input: {why}", form=form))
        done = f"supply-input: {answer.get('path')} supplied; the job is {answer.get('status')}"
        return self._redirect(page, Flash("message", done))

    async def action(self, request: Request) -> Response:
        """``POST /ui/jobs/{id}/action/{verb}``: an operator verb (only those listed), from a
        form whose ``confirm`` box is ticked; back to the job page (303) with the outcome as a
        message: what the job is now, or why the verb refused (naming the status the job is in
        when another operator or the worker got there first). ``promote-artifact`` comes from
        the artifacts list (``artifactId``, one of the job's, and ``reason``): the message
        names the artifact and its state now, or the verb's refusal (``not-verified`` naming
        the state it is in). An unreachable database answers the 503 page, a scope the caller
        lacks the 403 page (the refusal recorded in the job's history)."""
        if self._cross_site(request):
            return self._refused(request)
        job_id = request.path_params["job_id"]
        verb = request.path_params["verb"]
        if verb not in operate.ACTION_VERBS:
            return await self.job(request, error=f"unknown-action: {verb}", status=404)
        page = f"{PREFIX}/jobs/{urllib.parse.quote(job_id)}"
        form = await self._form(request)
        if verb not in self._verbs(request):
            # outside the caller's scopes: the verb refuses it (and records the refusal)
            # whatever else the form says
            _, error = await self._verb(request, verb, {"jobId": job_id})
            if error.startswith(_DENIED):
                return await self.job(request, error=error, status=403)
        try:
            envelope = operate.envelope(verb, job_id, form)
        except times.FormError as exc:
            return self._redirect(page, Flash("error", f"{verb}: {exc}"))
        answer, error = await self._verb(request, verb, envelope)
        if error.startswith(_UNAVAILABLE):  # no second wait for the same database
            return self._no_job(request, job_id, error)
        if error.startswith(_DENIED):
            return await self.job(request, error=error, status=403)
        ok, text = operate.outcome(verb, answer, error)
        return self._redirect(page, Flash("message" if ok else "error", text))

    async def bulk(self, request: Request) -> Response:
        """``POST /ui/bulk``: one operator verb (``action``: cancel-job, requeue-job or
        retry-step) on each job ticked in the list (``jobId``, repeated), confirmed; back to the
        list (its filters kept) with one line per job: what it is now, or why it was refused."""
        if self._cross_site(request):
            return self._refused(request)
        body = (await request.body()).decode("utf-8", errors="replace")
        fields = urllib.parse.parse_qs(body, keep_blank_values=True)
        form = {k: v[-1] for k, v in fields.items()}
        back = _list_url(form.get("back", ""))
        verb = form.get("action", "")
        ids = list(dict.fromkeys(i.strip() for i in fields.get("jobId", []) if i.strip()))
        problem = ""
        if verb not in operate.BULK_VERBS:
            problem = f"'action' must be one of {', '.join(operate.BULK_VERBS)}; got {verb!r}"
        elif not ids:
            problem = "'jobId' must name at least one job: tick the jobs to act on"
        elif len(ids) > BULK_MAX:
            problem = f"'jobId' may name at most {BULK_MAX} jobs; got {len(ids)}"
        elif verb == "retry-step" and not form.get("stepName", "").strip():
            problem = "'stepName' is required for retry-step: the step to run again"
        if problem:
            return self._redirect(back, Flash("error", f"bulk: invalid-input: {problem}"))
        rows: list[dict[str, Any]] = []
        for job_id in ids:
            try:
                envelope = operate.envelope(verb, job_id, form)
            except times.FormError as exc:
                return self._redirect(back, Flash("error", f"bulk {verb}: {exc}"))
            answer, error = await self._verb(request, verb, envelope)
            ok, text = operate.outcome(verb, answer, error)
            rows.append(
                {"jobId": job_id, "ok": ok, "status": answer.get("status", ""), "text": text}
            )
            if error.startswith(_UNAVAILABLE):
                break  # the rest would wait for the same database
        done = sum(1 for r in rows if r["ok"])
        summary = f"{verb} on {len(ids)} jobs: {done} done, {len(rows) - done} refused"
        if len(rows) < len(ids):
            summary += f", {len(ids) - len(rows)} not tried (the database cannot be reached)"
        kind = "message" if done == len(ids) else "warning" if done else "error"
        return self._redirect(back, Flash(kind, summary, rows))

    async def login_form(self, request: Request) -> Response:
        """``GET /ui/login``."""
        return self._render(request, "login.html", title="Sign in", error="")

    async def login(self, request: Request) -> Response:
        """``POST /ui/login``: a token the node's authority resolves is kept in a cookie; any
        other is refused on the form (401)."""
        if self._cross_site(request):
            return self._refused(request)
        form = await self._form(request)
        token = form.get("token", "").strip()
        if not self.authority.open:
            caller = await anyio.to_thread.run_sync(self.authority.resolve, token or None)
            if caller is None:
                return self._render(
                    request,
                    "login.html",
                    status=401,
                    title="Sign in",
                    error="Wrong token: no principal of this node holds it.",
                )
        response = RedirectResponse(f"{PREFIX}/", status_code=303)
        response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict", path="/")
        return response

    async def logout(self, request: Request) -> Response:
        """``POST /ui/logout``: forget the cookie."""
        response = RedirectResponse(f"{PREFIX}/login", status_code=303)
        response.delete_cookie(TOKEN_COOKIE, path="/")
        return response


def _list_url(query: str) -> str:
    """The jobs list with the filters of ``query`` (a list page's query string), keeping only
    the list's own parameters: a bulk action goes back to the list it came from, never to
    another address."""
    known = ("status", "workflow", "queue", "id", "after", "page")
    pairs = [
        (k, v[-1])
        for k, v in urllib.parse.parse_qs(query.lstrip("?"), keep_blank_values=False).items()
        if k in known
    ]
    return f"{PREFIX}/" + (f"?{urllib.parse.urlencode(pairs)}" if pairs else "")


#: Statuses of a finished job (nothing left to explain).
_FINISHED = frozenset({"COMPLETED", "FAILED", "DEAD", "CANCELLED"})


def _missing_inputs(explained: Any) -> list[dict[str, Any]]:
    """The input paths a run waits for (explain-job's ``input`` wait): ``[{path, owner,
    step}]``, each once; empty when it waits for none."""
    out: dict[str, dict[str, Any]] = {}
    steps = explained.get("steps", []) if isinstance(explained, dict) else []
    for step in steps:
        for wait in step.get("waitingOn") or []:
            if wait.get("kind") != "input":
                continue
            for path in wait.get("paths") or []:
                out.setdefault(
                    path["path"],
                    {"path": path["path"], "owner": path.get("owner"), "step": step["name"]},
                )
    return list(out.values())


def _may_vote(approval: dict[str, Any], caller: Caller) -> bool:
    """Whether ``caller`` is one of an approval step's approvers (by principal or group) and
    not the run's submitter (``submittedBy``: approve-step refuses its vote, self-approval)."""
    if approval.get("submittedBy") and caller.name == approval["submittedBy"]:
        return False
    return caller.name in approval["principals"] or bool(caller.groups & set(approval["roles"]))


def _error_status(error: str, otherwise: int) -> int:
    """The page status for a verb error: 503 unreachable database, 403 scope not held."""
    if error.startswith(_UNAVAILABLE):
        return 503
    if error.startswith(_DENIED):
        return 403
    return otherwise


def slash_redirect() -> Route:
    """The route for ``/ui`` without its trailing slash: a GET or HEAD is redirected (307) to
    ``/ui/``, its query string kept (a mount matches only ``/ui/...``, so without this route
    the actions route answered a 404 JSON body)."""

    async def redirect(request: Request) -> Response:
        query = request.url.query
        return RedirectResponse(f"{PREFIX}/" + (f"?{query}" if query else ""), status_code=307)

    return Route(PREFIX, redirect, methods=["GET", "HEAD"])


def dashboard_mount(
    catalog: Any, inspector: Any, authority: Authority, workflows: Any = None
) -> Mount:
    """The ``/ui`` mount for the node's HTTP app (behind its token guard, which resolves the
    signed-in caller).

    :param catalog: the node catalog.
    :param inspector: the jobs role's JobInspector (None: no events, steps or forms).
    :param authority: the node's resolver (an open one: no login).
    :param workflows: the registry's WorkflowRepository (None: the workflows page says so).
    """
    board = Dashboard(catalog, inspector, authority, workflows)
    router = Router(
        routes=[
            Route("/", board.jobs, methods=["GET"]),
            Route("/inbox", board.inbox, methods=["GET"]),
            Route("/workflows", board.workflow_list, methods=["GET"]),
            Route("/jobs/{job_id}", board.job, methods=["GET"]),
            Route("/jobs/{job_id}/complete", board.complete, methods=["POST"]),
            Route("/jobs/{job_id}/approve", board.approve, methods=["POST"]),
            Route("/jobs/{job_id}/supply", board.supply, methods=["POST"]),
            Route("/jobs/{job_id}/action/{verb}", board.action, methods=["POST"]),
            Route("/bulk", board.bulk, methods=["POST"]),
            Route("/login", board.login_form, methods=["GET"]),
            Route("/login", board.login, methods=["POST"]),
            Route("/logout", board.logout, methods=["POST"]),
            Mount("/static", app=StaticFiles(directory=str(_HERE / "static")), name="static"),
        ],
    )
    # form bodies are bounded before a handler reads one (body_limit.py)
    return Mount(PREFIX, app=BodyLimit(router))
