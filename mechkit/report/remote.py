"""A remote model's jobs, relayed to the run: live progress on its console, server timings for its report."""

from __future__ import annotations


def remote_progress(handle, console):
    """Live progress of a remote model's jobs (:func:`mechkit.model.backends.jobs.progress`); nothing otherwise."""
    from mechkit.model.backends.jobs import progress

    return progress(getattr(handle.backend, "log", None) if handle is not None else None, console)


def remote_timings(handle) -> dict:
    """``server_queue_s``, ``server_run_s``, ``server_total_s`` of a remote model's jobs (the rest of what
    they reported — jobs, bytes, the server's meta and peak memory — is in ``model.backend.server``)."""
    log = getattr(handle.backend, "log", None) if handle is not None else None
    return log.timings() if log is not None else {}
