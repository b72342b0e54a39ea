"""KVCM: wiring only. Routes live in chalicelib/routes; logic below them."""

from typing import Any

from chalice import Chalice, Rate
from chalice.app import CloudWatchEvent

from chalicelib import coldstart  # noqa: F401 - the app's first module: the GC waits while the rest is imported
from chalicelib.routes import admin, console, debug, docs, gateway, meta, ops, unknown
from chalicelib.runtime import get_runtime, job
from chalicelib.workflows import deletes

# The service logs through Powertools (logger "kvcm"); Chalice must not reconfigure it.
app = Chalice(app_name="kvcm", configure_logs=False)
if gateway.ENABLED:  # the stage deploys its API behind the gateway's authorizer
    app.register_blueprint(gateway.blueprint)
app.register_blueprint(meta.blueprint)
app.register_blueprint(admin.blueprint)
app.register_blueprint(debug.blueprint)
app.register_blueprint(ops.blueprint)
app.register_blueprint(docs.blueprint)
app.register_blueprint(console.blueprint)
app.register_blueprint(unknown.blueprint)


# ---------------------------------------------------------------- state machine tasks


@app.lambda_function(name="expire_write_sessions")
@job
def expire_write_sessions(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return get_runtime().session_reaper.expire_write_sessions()


@app.lambda_function(name="reaper_continue")
@job
def reaper_continue(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return get_runtime().session_reaper.reaper_continue(event)


@app.lambda_function(name="delete_batch")
@job
def delete_batch(event: dict[str, Any], context: Any) -> dict[str, Any]:
    runtime = get_runtime()
    return deletes.delete_batch(runtime.contexts, runtime.deletion, event)


@app.lambda_function(name="copy_begin")
@job
def copy_begin(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return get_runtime().copy_tasks.begin(event)


@app.lambda_function(name="copy_bytes")
@job
def copy_bytes(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return get_runtime().copy_tasks.copy(event)


@app.lambda_function(name="copy_finish")
@job
def copy_finish(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return get_runtime().copy_tasks.finish(event)


@app.lambda_function(name="copy_quarantine")
@job
def copy_quarantine(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return get_runtime().copy_tasks.hold(event)


@app.lambda_function(name="purge_step")
@job
def purge_step(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return get_runtime().purge_executions.purge_step(event)


@app.lambda_function(name="purge_continue")
@job
def purge_continue(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return get_runtime().purge_executions.purge_continue(event)


@app.lambda_function(name="optimizer_run")
@job
def optimizer_run(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from chalicelib.optimizer import tasks

    return tasks.run_task(event, get_runtime().s3_transfers())


@app.lambda_function(name="optimizer_report")
@job
def optimizer_report(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from chalicelib.optimizer import tasks

    return tasks.report_task(event, get_runtime().s3_transfers())


# ---------------------------------------------------------------- schedules


@app.schedule(Rate(1, unit=Rate.MINUTES), name="reaper_watchdog")
@job
def reaper_watchdog(event: CloudWatchEvent) -> dict[str, Any]:
    return get_runtime().session_reaper.reaper_watchdog()


@app.schedule(Rate(5, unit=Rate.MINUTES), name="purge_watchdog")
@job
def purge_watchdog(event: CloudWatchEvent) -> dict[str, Any]:
    return get_runtime().purge_executions.purge_watchdog()


@app.schedule(Rate(1, unit=Rate.MINUTES), name="health_check")
@job
def health_check(event: CloudWatchEvent) -> dict[str, Any]:
    return get_runtime().health_checks.run_health_checks()


@app.schedule(Rate(1, unit=Rate.MINUTES), name="reclaim")
@job
def reclaim(event: CloudWatchEvent) -> dict[str, Any]:
    return get_runtime().reclaim_job.run()


@app.schedule(Rate(1, unit=Rate.MINUTES), name="cache_gc")
@job
def cache_gc(event: CloudWatchEvent) -> dict[str, Any]:
    return get_runtime().cache_gc.run()


@app.schedule(Rate(1, unit=Rate.MINUTES), name="usage_metrics")
@job
def usage_metrics(event: CloudWatchEvent) -> dict[str, Any]:
    return get_runtime().usage_metrics.run()


@app.schedule(Rate(1, unit=Rate.MINUTES), name="event_report_liveness")
@job
def event_report_liveness(event: CloudWatchEvent) -> dict[str, Any]:
    return get_runtime().reporter_liveness.event_report_liveness()


@app.schedule(Rate(1, unit=Rate.MINUTES), name="hit_curves")
@job
def hit_curves(event: CloudWatchEvent) -> dict[str, Any]:
    return get_runtime().hit_curves.run()


@app.schedule(Rate(1, unit=Rate.HOURS), name="instance_tuning")
@job
def instance_tuning(event: CloudWatchEvent) -> dict[str, Any]:
    return get_runtime().instance_tuning.run()
