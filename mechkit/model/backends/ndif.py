"""The NDIF server behind the nnsight backend: connecting, sending a job, reporting its updates, failing in one line.

NDIF (https://ndif.us) runs nnsight requests on models it hosts. The client builds the model's structure
on the meta device from the hub config (no weights), checks the server's ``/status`` before anything
else, and sends each job through nnsight's own blocking client (:func:`reporting_remote`), whose status
updates go to the backend's :class:`~mechkit.model.backends.jobs.JobLog`.
Every failure a user can meet — no API key, an unreachable server, a model it does not host, a rejected
request, a job that failed on the server — is one :class:`~mechkit.model.backends.base.BackendError` line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from mechkit.errors import MechkitError, ModelLoadError, first_line
from mechkit.model.backends.base import BackendError, Server, nnsight_model


class NdifServer(Server):
    """Jobs go to NDIF through nnsight's own blocking client (:func:`reporting_remote`); a failed
    request is one line (:meth:`errors`)."""

    name = "ndif"

    def job_backend(self, runner: Any, roots: set[str], traces: int) -> Any:
        """NDIF ships nothing by value itself (nnsight's serialiser does), so ``roots`` are not needed here;
        the model key is asked of the hub once per runner (nnsight's, naming the hub id and revision)."""
        if runner.job_key is None:
            runner.job_key = runner.lm.to_model_key()
        return reporting_remote(runner.lm, runner.log, traces, runner.job_key)

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """A failed NDIF request is one line, never a traceback (errors of mechkit's own code pass through)."""
        try:
            yield
        except MechkitError:
            raise
        except Exception as err:
            if isinstance(err, OSError) or type(err).__name__ in ("ConnectError", "ConnectTimeout"):
                from nnsight import CONFIG

                raise BackendError(f"cannot reach the NDIF server at {CONFIG.API.HOST} ({_last_line(err)})",
                                   "check your network (or NDIF_HOST); --remote local simulates a server offline") from err
            if _network_error(err):
                raise BackendError(f"the NDIF request failed: {_last_line(err)}",
                                   "check NDIF_API_KEY, the network and that the server hosts the model "
                                   "(python -c 'import nnsight; print(nnsight.status())')") from err
            raise


def reporting_remote(lm: Any, log: Any, traces: int, model_key: str | None = None) -> Any:
    """nnsight's blocking NDIF backend for one job, its updates going to ``log`` instead of nnsight's own
    status line (on stdout, where mechkit prints its summary), and the request's and reply's sizes kept.
    ``model_key`` defaults to the one nnsight makes for ``lm`` (its hub id and revision)."""
    from nnsight.intervention.backends.remote import RemoteBackend

    class ReportingRemote(RemoteBackend):
        def __init__(self) -> None:
            super().__init__(model_key or lm.to_model_key(), env=lm._remoteable_get_env(), blocking=True)
            self.display.enabled = False
            self.job = log.start(traces)

        def note(self, response: Any) -> bool:
            log.note(self.job, response.status.value, response.description or "", response.meta)
            return super().note(response)

        def _serialize(self, tracer: Any) -> bytes:
            blob = super()._serialize(tracer)
            self.job.request_bytes = len(blob)
            return blob

        def finalize(self, content: bytes) -> Any:
            self.job.result_bytes = len(content)
            return super().finalize(content)

    return ReportingRemote()


def _network_error(err: BaseException) -> bool:
    """A failure of the request or the job (nnsight's RemoteError, httpx, websocket, sockets), not of mechkit."""
    names = {"RemoteError", "ConnectError", "TimeoutException", "HTTPStatusError", "WebSocketException"}
    return isinstance(err, OSError) or any(c.__name__ in names for c in type(err).__mro__)


def _last_line(err: BaseException) -> str:
    """A failed job's message: NDIF sends the server's traceback, then the error; the error is the line.

    >>> _last_line(RuntimeError("Traceback (most recent call last):\\n  File ...\\nCUDA out of memory\\n"))
    'CUDA out of memory'
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def api_key() -> str | None:
    """The NDIF API key nnsight will send (``NDIF_API_KEY`` or nnsight's config), or None."""
    from nnsight import CONFIG

    return CONFIG.API.APIKEY or None


def client_model(repo_id: str) -> Any:
    """The client's nnsight model of ``repo_id``: its structure on the meta device, built from the config
    it reads from the hub (one line where that fails, e.g. offline or a mistyped id)."""
    try:
        return nnsight_model(repo_id)
    except Exception as err:
        raise ModelLoadError(f"cannot build {repo_id} for NDIF: {first_line(err)}",
                             "the client reads the model's config from the hub: check the id and your network") from err


def hosted_models(state: dict) -> list[str]:
    """The hub ids an NDIF ``/status`` reply lists as deployed (``HOT`` or ``WARM``; nnsight's own table
    shows the same), sorted.

    >>> hosted_models({"deployments": {"a": {"repo_id": "org/b", "deployment_level": "HOT"},
    ...                                "c": {"repo_id": "org/a", "deployment_level": "WARM"},
    ...                                "d": {"repo_id": "org/cold", "deployment_level": "COLD"}}})
    ['org/a', 'org/b']
    """
    deployments = state.get("deployments") if isinstance(state, dict) else None
    return sorted({str(d.get("repo_id") or name) for name, d in (deployments or {}).items()
                   if isinstance(d, dict) and d.get("deployment_level") in ("HOT", "WARM")})


def check_hosted(repo_id: str, state: dict) -> None:
    """Refuse (one line naming what the server hosts) a model the ``/status`` reply does not list; a
    reply that lists nothing says nothing, and the job itself will answer.

    >>> check_hosted("org/x", {"deployments": {"a": {"repo_id": "org/y", "deployment_level": "HOT"}}})
    Traceback (most recent call last):
    ...
    mechkit.model.backends.base.BackendError: NDIF does not host org/x right now — use one it hosts: org/y
    """
    hosted = hosted_models(state)
    if hosted and repo_id not in hosted:
        shown = ", ".join(hosted[:12]) + (" …" if len(hosted) > 12 else "")
        raise BackendError(f"NDIF does not host {repo_id} right now", f"use one it hosts: {shown}")


def refuse_remote_weights(module: Any) -> None:
    """One line, where a step reads a weight of a model on NDIF locally (the client has structure only)."""
    repo = module.__dict__.get("_mechkit_remote")
    if repo is not None:
        raise BackendError(f"this step reads weights of {repo}, which stay on the NDIF server (the client holds "
                           "its structure only)", "run it on a local copy of the model (without --remote)")


def client_tokenizer(lm: Any) -> Any:
    """The tokenizer mechkit uses beside an NDIF model: nnsight's, copied, padding on the right again."""
    import copy

    tok = copy.deepcopy(lm.tokenizer)
    if tok is not None:
        tok.padding_side = "right"
    return tok


def connect(repo_id: str) -> Any:
    """The client's nnsight model of ``repo_id`` on NDIF: its structure only (no weights), once the server
    answers and hosts it.

    Refuses, with one line each: an unreachable server, a model the server does not host (naming what it
    hosts when it says); the API key is checked before (:func:`mechkit.model.backends.remotes.check_remote`).
    """
    import io
    from contextlib import redirect_stderr

    import nnsight.ndif as ndif
    from nnsight import CONFIG

    with redirect_stderr(io.StringIO()):  # nnsight prints its own "service down" message
        state = ndif.status(raw=True)
    if not state:
        raise BackendError(f"cannot reach the NDIF server at {CONFIG.API.HOST}",
                           "check your network (or NDIF_HOST); --remote local simulates a server offline")
    check_hosted(repo_id, state)
    lm = client_model(repo_id)
    for module in lm._module.modules():  # the client's copy holds no weights: say so where one is read
        module.__dict__["_mechkit_remote"] = repo_id
    return lm
